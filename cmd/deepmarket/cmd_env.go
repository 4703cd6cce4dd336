package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/units"
)

func newEnvCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Share a job's environment, an OCI image, by content address (add, build, pack, debian, ls, show, rm)",
		Long: `A job may bring its own environment: an OCI image, named in its job.toml
as image = "CID" (or the image's OCI layout directory, added at submit).
Lenders fetch it over bitswap like a dataset, check every layer against its
digest, unpack it once into their image cache and run the job's workers in
it, in the same sandbox, instead of their own Python.

'env add' takes an OCI image layout directory, a 'docker save' /
'podman save' tarball, or a registry reference that names its registry
(ghcr.io/lab/train:1; pulled with docker's credentials, the linux image for
this machine's architecture). It checks every layer, writes the image as an
OCI layout and adds that to this node: it prints the CID to put in job.toml
and the image's manifest digest. The same image gives the same CID from any
form. With --name, a job.toml on this node may say image = "NAME" instead
of the CID. 'env ls' lists the images added here, 'env show' one of them,
and 'env rm' forgets one and unpins it ('data gc' then frees its space).

'env build' makes an image here: a base plus a project's requirements.txt
or pyproject.toml, pip running in the job sandbox. 'env pack' packs a
virtualenv that works here onto a base with the same python3. 'env debian'
makes a minimal Debian base with python3 (and Debian's packages, such as
python3-torch) with mmdebstrap, without a registry.`,
		Example: `  docker save lab/train:1 -o train.tar && deepmarket env add train.tar --name train
  deepmarket env add ./train-oci
  deepmarket env add ghcr.io/lab/train:1 --name train
  deepmarket env build ./my-job --base train --name my-job-env
  deepmarket env ls
  deepmarket env rm train`,
	}
	cmd.AddCommand(newEnvAddCmd(c), newEnvBuildCmd(c), newEnvPackCmd(c), newEnvDebianCmd(c), newEnvLsCmd(c), newEnvShowCmd(c), newEnvRmCmd(c))
	return cmd
}

func newEnvLsCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "ls", Short: "List the images added here, newest first", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]api.EnvImage, error) {
		return cl.EnvList(ctx)
	}, func(imgs []api.EnvImage) error {
		if len(imgs) == 0 {
			fmt.Fprintln(c.out, "no images (add one with `deepmarket env add IMAGE --name NAME`)")
			return nil
		}
		rows := make([][]string, 0, len(imgs))
		for _, img := range imgs {
			name := img.Name
			if name == "" {
				name = "-"
			}
			rows = append(rows, []string{name, img.CID, shortDigest(img.Digest), fmt.Sprint(img.Layers),
				units.FormatSize(uint64(img.Size)), img.AddedAt.Local().Format("2006-01-02 15:04")})
		}
		c.table("NAME\tCID\tDIGEST\tLAYERS\tSIZE\tADDED", rows)
		return nil
	})
}

func newEnvShowCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "show NAME|CID", Short: "Show an image added here", Args: exactArgs(1, "NAME|CID")}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, args []string) (api.EnvImage, error) {
		return cl.EnvShow(ctx, args[0])
	}, func(img api.EnvImage) error {
		name := img.Name
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(c.out, "name:    %s\ncid:     %s\ndigest:  %s\nlayers:  %d\nsize:    %s\nadded:   %s\n", name, img.CID, img.Digest,
			img.Layers, units.FormatSize(uint64(img.Size)), img.AddedAt.Local().Format(time.RFC1123))
		fmt.Fprintf(c.out, "in job.toml: image = %q\n", cmp.Or(img.Name, img.CID))
		return nil
	})
}

func newEnvRmCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME|CID",
		Short: "Forget an image and unpin it (its blocks go at the next `data gc`)",
		Args:  exactArgs(1, "NAME|CID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			img, err := cl.EnvRemove(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.out, "removed image %s (%s); run `deepmarket data gc` to free its space\n", cmp.Or(img.Name, img.CID), shortDigest(img.Digest))
			return nil
		},
	}
}

// shortDigest is a digest's first 12 hex digits, as docker shows it.
func shortDigest(d string) string {
	if h, ok := strings.CutPrefix(d, "sha256:"); ok && len(h) >= 12 {
		return h[:12]
	}
	return d
}

// envAdded is what env add prints with --json.
type envAdded struct {
	CID    string `json:"cid"`
	Digest string `json:"digest"`
	Layers int    `json:"layers"`
	Size   int64  `json:"size"`
	Name   string `json:"name,omitempty"`
}

func newEnvAddCmd(c *cli) *cobra.Command {
	var asJSON bool
	var name string
	cmd := &cobra.Command{
		Use:   "add IMAGE",
		Short: "Add an OCI image (layout directory, docker/podman save tarball, or registry reference); print its CID",
		Args:  exactArgs(1, "IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" {
				if err := api.CheckEnvName(name); err != nil {
					return usageError{fmt.Errorf("env add --name: %w", err)}
				}
			}
			tmp, err := os.MkdirTemp("", "deepmarket-image-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir := filepath.Join(tmp, "image")
			n, digest, err := envLayout(cmd.Context(), args[0], dir, asJSON)
			if err != nil {
				return err
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
			out := envAdded{CID: pin.CID, Digest: digest.String(), Layers: n, Size: pin.Size, Name: name}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			if _, err := cl.EnvRecord(ctx, api.EnvRecordRequest{Name: name, CID: out.CID, Digest: out.Digest, Layers: n, Size: out.Size}); err != nil {
				return fmt.Errorf("env add: the image is pinned as %s, but recording it failed: %w", out.CID, err)
			}
			if asJSON {
				return c.printJSON(out)
			}
			named := ""
			if name != "" {
				named = " as " + name
			}
			fmt.Fprintf(c.out, "added image %s%s (%d layers, %s)\n%s\n", out.Digest, named, n, units.FormatSize(uint64(out.Size)), out.CID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {cid, digest, layers, size, name} as JSON")
	cmd.Flags().StringVar(&name, "name", "", "record the image under NAME too: a job.toml may then say image = \"NAME\" (given again, the name moves to this image)")
	return cmd
}

// envLayout checks the image src names and writes it as an OCI layout in
// dir; it returns its layer count and manifest digest. src is a layout
// directory or a save tarball, or, when no such file exists, a registry
// reference, which is pulled (quiet: without saying so on stderr).
func envLayout(ctx context.Context, src, dir string, quiet bool) (int, v1.Hash, error) {
	write := func(img v1.Image) error {
		p, err := layout.Write(dir, empty.Index)
		if err == nil {
			err = p.AppendImage(img)
		}
		if err != nil {
			return fmt.Errorf("env add: write the image's layout: %w", err)
		}
		return nil
	}
	var img v1.Image
	pulled := false
	if _, err := os.Stat(src); err != nil && image.IsReference(src) {
		if !quiet {
			fmt.Fprintf(os.Stderr, "pulling %s...\n", src)
		}
		remote, err := image.Pull(ctx, src)
		if err != nil {
			return 0, v1.Hash{}, fmt.Errorf("env add: %w", err)
		}
		// Written as it is pulled, each layer fetched once, then checked
		// from there.
		if err := write(remote); err != nil {
			return 0, v1.Hash{}, interrupted(ctx, err, "the pull was cancelled; nothing was added")
		}
		if img, err = image.Open(dir); err != nil {
			return 0, v1.Hash{}, fmt.Errorf("env add: %w", err)
		}
		pulled = true
	} else if img, err = image.Open(src); err != nil {
		return 0, v1.Hash{}, usageError{fmt.Errorf("env add: %w (or a registry reference such as ghcr.io/lab/train:1)", err)}
	}
	n, err := image.Verify(img)
	if err != nil {
		return 0, v1.Hash{}, fmt.Errorf("env add: %s: %w", src, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return 0, v1.Hash{}, fmt.Errorf("env add: %w", err)
	}
	if pulled {
		return n, digest, nil
	}
	return n, digest, write(img)
}
