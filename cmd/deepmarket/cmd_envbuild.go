package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/envbuild"
	"github.com/deepmarket/deepmarket/units"
)

func newEnvBuildCmd(c *cli) *cobra.Command {
	var asJSON bool
	var base, wheels, name string
	cmd := &cobra.Command{
		Use:   "build PROJECT --base IMAGE",
		Short: "Build an image: a base image plus the Python packages PROJECT's requirements.txt or pyproject.toml asks for",
		Long: `Build a job's environment on this node: the base image plus what PROJECT
asks for. PROJECT is a directory holding a requirements.txt, a
pyproject.toml (the project itself is installed too), or both.

pip runs in the job sandbox on this machine, never on a lender: its own
uid, no network, the base image as its root filesystem (which needs
python3, and no pip of its own: the node's pip is used). It installs
from wheels alone, into one new layer under /opt/deepmarket/site, which
the image's PYTHONPATH and PATH then name:
  - with --wheels DIR, from that wheelhouse only (offline builds; make one
    with 'pip download -d DIR -r requirements.txt' or 'pip wheel');
  - otherwise the node's pip downloads them first, outside the sandbox and
    binary only (--only-binary=:all:, so no package's code runs there),
    for the base image's Python version and platform.

The base is an image added here (its name or CID), an OCI layout
directory or save tarball, or a registry reference (ghcr.io/lab/py:3.11).
'deepmarket env debian' makes a minimal Debian one locally. The built
image is added and recorded as 'env add' does: put the CID it prints, or
its --name, in job.toml as image = "...".`,
		Example: `  deepmarket env debian /var/tmp/py311 --apt python3-numpy
  deepmarket env build ./my-job --base /var/tmp/py311 --name my-job-env
  deepmarket env build ./my-job --base my-base --wheels ./wheelhouse`,
		Args: exactArgs(1, "PROJECT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			project, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if base, err = baseArg("env build", base); err != nil {
				return err
			}
			if wheels != "" {
				if wheels, err = filepath.Abs(wheels); err != nil {
					return err
				}
			}
			return c.envBuild(cmd, api.EnvBuildRequest{Project: project, Base: base, Wheels: wheels, Name: name}, asJSON)
		},
	}
	cmd.Flags().StringVar(&base, "base", "", "the image the packages go on: a name or CID added here, an image file or layout directory, or a registry reference")
	cmd.Flags().StringVar(&wheels, "wheels", "", "install from this wheelhouse directory alone (no download)")
	cmd.Flags().StringVar(&name, "name", "", "record the image under NAME too: a job.toml may then say image = \"NAME\"")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {cid, digest, layers, size, name} as JSON")
	return cmd
}

func newEnvDebianCmd(c *cli) *cobra.Command {
	var req envbuild.DebianRequest
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "debian OUT",
		Short: "Make a minimal Debian image with python3 (and --apt packages) locally, as an OCI layout directory",
		Long: `Make a base image without a registry or a container engine: mmdebstrap
(apt-get install mmdebstrap) lays out Debian's minbase variant with
python3 and the --apt packages from a Debian mirror, without recommended
packages, manuals, translations or documentation. The image is written
to OUT as an OCI image layout directory, for 'env build --base OUT' or
'env add OUT'. Debian's own packages (python3-numpy, python3-torch,
python3-sklearn) come built for the image's python3, with no wheels to
find. It needs root, or user namespaces (mmdebstrap's unshare mode).`,
		Example: `  deepmarket env debian /var/tmp/py-torch --apt python3-torch,python3-numpy
  deepmarket env build ./my-job --base /var/tmp/py-torch --name my-job-env`,
		Args: exactArgs(1, "OUT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Out = args[0]
			if !asJSON {
				req.Say = func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), s) }
			}
			img, err := envbuild.Debian(cmd.Context(), req)
			if err != nil {
				return interrupted(cmd.Context(), fmt.Errorf("env debian: %w", err), "cancelled; nothing was written")
			}
			digest, err := img.Digest()
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(map[string]string{"path": req.Out, "digest": digest.String()})
			}
			fmt.Fprintf(c.out, "wrote image %s to %s\n", digest, req.Out)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Suite, "suite", "bookworm", "the Debian release")
	cmd.Flags().StringVar(&req.Mirror, "mirror", envbuild.DefaultMirror, "the Debian mirror")
	cmd.Flags().StringSliceVar(&req.Apt, "apt", nil, "Debian packages to install beside python3 (comma-separated)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {path, digest} as JSON")
	return cmd
}

// baseArg checks a --base: required, and a file here is named by its
// full path, for the node to read.
func baseArg(what, base string) (string, error) {
	if base == "" {
		return "", usageError{fmt.Errorf("%s: --base is required: the image to build on (a name or CID from `deepmarket env ls`, an image file or directory, or a registry reference)", what)}
	}
	if _, err := os.Stat(base); err == nil {
		return filepath.Abs(base)
	}
	return base, nil
}

// envBuild has the node build (or pack) the image req asks for, its
// steps on stderr, and prints what it added.
func (c *cli) envBuild(cmd *cobra.Command, req api.EnvBuildRequest, asJSON bool) error {
	if req.Name != "" {
		if err := api.CheckEnvName(req.Name); err != nil {
			return usageError{fmt.Errorf("--name: %w", err)}
		}
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	bar := newProgressBar("adding the image", asJSON)
	img, err := cl.EnvBuild(cmd.Context(), req, func(p api.Progress) {
		if p.Step == "" {
			bar.update(p)
		} else if !asJSON {
			fmt.Fprintln(cmd.ErrOrStderr(), p.Step)
		}
	})
	bar.done(err)
	if err != nil {
		return interrupted(cmd.Context(), err, "the build was cancelled; nothing was added")
	}
	if asJSON {
		return c.printJSON(envAdded{CID: img.CID, Digest: img.Digest, Layers: img.Layers, Size: img.Size, Name: img.Name})
	}
	named := ""
	if img.Name != "" {
		named = " as " + img.Name
	}
	fmt.Fprintf(c.out, "built image %s%s (%d layers, %s)\n%s\n", img.Digest, named, img.Layers, units.FormatSize(uint64(img.Size)), img.CID)
	return nil
}

func newEnvPackCmd(c *cli) *cobra.Command {
	var asJSON bool
	var base, name string
	cmd := &cobra.Command{
		Use:   "pack VENV --base IMAGE",
		Short: "Pack a virtualenv that works here into an image: its site-packages on a base with the same python3",
		Long: `Pack the virtualenv VENV, as it is, into a job's environment: its
site-packages become one layer of the base image, under
/opt/deepmarket/site (on the image's PYTHONPATH), as conda-pack does for
conda environments. Nothing is downloaded or installed: what works in the
virtualenv here works in the image, where the base's python3 is the same
version as the virtualenv's (the node checks, running it once in the
sandbox). The virtualenv's bin is left out: its scripts name this
machine's interpreter. Packages that rely on .pth files (editable
installs) do not load from PYTHONPATH; install them normally first.`,
		Example: `  deepmarket env debian /var/tmp/py311
  deepmarket env pack /opt/deepmarket/venv --base /var/tmp/py311 --name tf-2.20`,
		Args: exactArgs(1, "VENV"),
		RunE: func(cmd *cobra.Command, args []string) error {
			venv, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if base, err = baseArg("env pack", base); err != nil {
				return err
			}
			return c.envBuild(cmd, api.EnvBuildRequest{Venv: venv, Base: base, Name: name}, asJSON)
		},
	}
	cmd.Flags().StringVar(&base, "base", "", "the image to pack on, whose python3 is the virtualenv's version: a name or CID added here, an image file or layout directory, or a registry reference")
	cmd.Flags().StringVar(&name, "name", "", "record the image under NAME too: a job.toml may then say image = \"NAME\"")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {cid, digest, layers, size, name} as JSON")
	return cmd
}
