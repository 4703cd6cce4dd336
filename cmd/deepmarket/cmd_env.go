package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/units"
)

func newEnvCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Share a job's environment, an OCI image, by content address (add)",
		Long: `A job may bring its own environment: an OCI image, named in its job.toml
as image = "CID" (or the image's OCI layout directory, added at submit).
Lenders fetch it over bitswap like a dataset, check every layer against its
digest, unpack it once into their image cache and run the job's workers in
it, in the same sandbox, instead of their own Python.

'env add' takes an OCI image layout directory or a 'docker save' /
'podman save' tarball, checks every layer, writes the image as an OCI
layout and adds that to this node: it prints the CID to put in job.toml and
the image's manifest digest. The same image gives the same CID from either
form.`,
		Example: `  docker save lab/train:1 -o train.tar && deepmarket env add train.tar
  deepmarket env add ./train-oci`,
	}
	cmd.AddCommand(newEnvAddCmd(c))
	return cmd
}

// envAdded is what env add prints with --json.
type envAdded struct {
	CID    string `json:"cid"`
	Digest string `json:"digest"`
	Layers int    `json:"layers"`
	Size   int64  `json:"size"`
}

func newEnvAddCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add IMAGE",
		Short: "Add an OCI image (layout directory or docker/podman save tarball); print its CID",
		Args:  exactArgs(1, "IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			img, err := image.Open(args[0])
			if err != nil {
				return usageError{fmt.Errorf("env add: %w", err)}
			}
			n, err := image.Verify(img)
			if err != nil {
				return fmt.Errorf("env add: %s: %w", args[0], err)
			}
			digest, err := img.Digest()
			if err != nil {
				return fmt.Errorf("env add: %w", err)
			}
			tmp, err := os.MkdirTemp("", "deepmarket-image-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir := filepath.Join(tmp, "image")
			p, err := layout.Write(dir, empty.Index)
			if err == nil {
				err = p.AppendImage(img)
			}
			if err != nil {
				return fmt.Errorf("env add: write the image's layout: %w", err)
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			bar := newProgressBar("adding image "+digest.Hex[:12], asJSON)
			pin, err := cl.DataAdd(cmd.Context(), dir, bar.update)
			bar.done(err)
			if err != nil {
				return interrupted(cmd.Context(), err, "the add was cancelled; nothing was pinned")
			}
			out := envAdded{CID: pin.CID, Digest: digest.String(), Layers: n, Size: pin.Size}
			if asJSON {
				return c.printJSON(out)
			}
			fmt.Fprintf(c.out, "added image %s (%d layers, %s)\n%s\n", out.Digest, n, units.FormatSize(uint64(out.Size)), out.CID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {cid, digest, layers, size} as JSON")
	return cmd
}
