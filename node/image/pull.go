package image

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// IsReference says whether s names an image in a registry rather than a
// file: it parses as a reference and names its registry, a first
// component with a dot or a port, or localhost ("ghcr.io/lab/train:1",
// "registry.lab.example:5000/train@sha256:..."). "train.tar" or
// "lab/train" alone do not: a missing file is not pulled from Docker Hub.
func IsReference(s string) bool {
	host, _, ok := strings.Cut(s, "/")
	if !ok || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return false
	}
	_, err := name.ParseReference(s, name.StrictValidation)
	return err == nil
}

// Pull is the image ref names in its registry: for an index, its image
// for linux on this machine's architecture. It authenticates as docker's
// own config says (~/.docker/config.json, credential helpers), and talks
// plain HTTP only to a registry on localhost or a private address, as
// docker does. Its layers are fetched as they are read, and checked
// against their digests then.
func Pull(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("%q is not an image reference: %w", ref, err)
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", r, err)
	}
	return img, nil
}
