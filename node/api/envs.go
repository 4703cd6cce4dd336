package api

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/fault"
)

// EnvImage is an OCI image this node added (`env add`): a job's
// environment, named in its job.toml by CID or by Name.
type EnvImage struct {
	Name    string    `json:"name,omitempty"`
	CID     string    `json:"cid"`
	Digest  string    `json:"digest"` // the manifest's, sha256:...
	Layers  int       `json:"layers"`
	Size    int64     `json:"size"` // bytes of the OCI layout's blocks
	AddedAt time.Time `json:"added_at"`
}

// EnvRecordRequest records an image the CLI checked and added (its CID
// pinned here) under a name, which may be empty.
type EnvRecordRequest struct {
	Name   string `json:"name,omitempty"`
	CID    string `json:"cid"`
	Digest string `json:"digest"`
	Layers int    `json:"layers"`
	Size   int64  `json:"size"`
}

// EnvBuildRequest builds an image on the node (`env build`): Base plus
// the Python packages Project asks for, or plus the site-packages of the
// virtualenv Venv (`env pack`). Paths are on the node's machine.
type EnvBuildRequest struct {
	// Project is a directory holding requirements.txt, pyproject.toml or
	// both.
	Project string `json:"project,omitempty"`
	// Venv, instead of Project, is a virtualenv whose site-packages
	// become the image's new layer as they are.
	Venv string `json:"venv,omitempty"`
	// Base is the image the packages go on: a CID or a name added here,
	// an OCI layout directory or save tarball, or a registry reference.
	Base string `json:"base"`
	// Wheels, when set, is a wheelhouse directory pip installs from
	// alone; otherwise the node's pip downloads the wheels first.
	Wheels string `json:"wheels,omitempty"`
	// Name records the built image under a name too.
	Name string `json:"name,omitempty"`
}

// EnvBuild builds an image, adds it and records it; progress gets its
// steps and pip's output (Step), then the add's bytes.
func (c *Client) EnvBuild(ctx context.Context, req EnvBuildRequest, progress func(Progress)) (EnvImage, error) {
	var out EnvImage
	return out, c.doStream(ctx, http.MethodPost, "/api/v1/envs/build", req, &out, progress)
}

// EnvRecord records an added image.
func (c *Client) EnvRecord(ctx context.Context, req EnvRecordRequest) (EnvImage, error) {
	var out EnvImage
	return out, c.do(ctx, http.MethodPost, "/api/v1/envs", req, &out)
}

// EnvList lists the images added here, newest first.
func (c *Client) EnvList(ctx context.Context) ([]EnvImage, error) {
	var out []EnvImage
	return out, c.do(ctx, http.MethodGet, "/api/v1/envs", nil, &out)
}

// EnvShow is one image, by name or CID.
func (c *Client) EnvShow(ctx context.Context, ref string) (EnvImage, error) {
	var out EnvImage
	return out, c.do(ctx, http.MethodGet, "/api/v1/envs/"+url.PathEscape(ref), nil, &out)
}

// EnvRemove forgets an image, by name or CID, and unpins its CID when no
// other name records it.
func (c *Client) EnvRemove(ctx context.Context, ref string) (EnvImage, error) {
	var out EnvImage
	return out, c.do(ctx, http.MethodDelete, "/api/v1/envs/"+url.PathEscape(ref), nil, &out)
}

// envNameRE is what an image's name may be: a job.toml names it beside
// paths and CIDs, and the API in a URL path.
var envNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)

// CheckEnvName says why name cannot name an image, or nil.
func CheckEnvName(name string) error {
	if !envNameRE.MatchString(name) {
		return fault.New(fault.Invalid, "name", "image name %q: 1 to 64 letters, digits, '.', '_', ':' and '-', starting with a letter or digit", name)
	}
	if _, err := cid.Decode(name); err == nil {
		return fault.New(fault.Invalid, "name", "image name %q reads as a CID: choose another", name)
	}
	return nil
}
