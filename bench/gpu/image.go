package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/bench/internal/testbed"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// cudaProbe initializes CUDA through the driver library alone
// (libcuda.so.1, which the lender binds into a GPU job's image), makes a
// context on the first GPU, writes 64 MiB on it and reads some back. It
// prints "CUDA_OK <GPUs> <name>" and exits 0, or says which call failed.
const cudaProbe = `#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef unsigned long long dptr;
typedef int (*f_init)(unsigned);
typedef int (*f_count)(int *);
typedef int (*f_get)(int *, int);
typedef int (*f_name)(char *, int, int);
typedef int (*f_retain)(void **, int);
typedef int (*f_current)(void *);
typedef int (*f_alloc)(dptr *, size_t);
typedef int (*f_set)(dptr, unsigned char, size_t);
typedef int (*f_copy)(void *, dptr, size_t);
#define SYM(t, n) t n = (t)dlsym(h, #n); if (!n) { printf("CUDA_FAIL no symbol " #n "\n"); return 2; }
#define CALL(e) if ((r = (e)) != 0) { printf("CUDA_FAIL %s: error %d\n", #e, r); return 3; }
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("CUDA_FAIL dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
	SYM(f_init, cuInit)
	SYM(f_count, cuDeviceGetCount)
	SYM(f_get, cuDeviceGet)
	SYM(f_name, cuDeviceGetName)
	SYM(f_retain, cuDevicePrimaryCtxRetain)
	SYM(f_current, cuCtxSetCurrent)
	SYM(f_alloc, cuMemAlloc_v2)
	SYM(f_set, cuMemsetD8_v2)
	SYM(f_copy, cuMemcpyDtoH_v2)
	int r, n = 0, dev = 0; void *ctx; dptr p; char name[256] = {0}; unsigned char back[4096];
	CALL(cuInit(0))
	CALL(cuDeviceGetCount(&n))
	CALL(cuDeviceGet(&dev, 0))
	CALL(cuDeviceGetName(name, sizeof name, dev))
	CALL(cuDevicePrimaryCtxRetain(&ctx, dev))
	CALL(cuCtxSetCurrent(ctx))
	CALL(cuMemAlloc_v2(&p, 64 << 20))
	CALL(cuMemsetD8_v2(p, 0x5a, 64 << 20))
	CALL(cuMemcpyDtoH_v2(back, p + (32 << 20), sizeof back))
	for (size_t i = 0; i < sizeof back; i++) if (back[i] != 0x5a) { printf("CUDA_FAIL read back %u at %zu\n", back[i], i); return 4; }
	printf("CUDA_OK %d %s\n", n, name);
	return 0;
}
`

// marketImage runs a 1-GPU job through the market in an image that holds
// no driver and no framework: the CUDA probe, compiled here, and the C
// libraries it and the driver load. It passes when the worker, in the
// image's root, reaches the GPU through the driver the lender binds in
// (as nvidia-container-toolkit does): the probe's "CUDA_OK" in its log.
func (b *bench) marketImage(ctx context.Context) Run {
	r := Run{Name: "market-image", Command: []string{"/usr/bin/cudaprobe"},
		How: "through the market: a 1-GPU generic job in an image of the CUDA probe and its C libraries (no driver, no framework): " +
			"the lender binds the host's driver into it"}
	log.Printf("== market-image: a 1-GPU job in an image without a driver")
	dir, err := os.MkdirTemp("", "dm-bench-gpu-image-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	oci, err := probeImage(ctx, dir)
	if err != nil {
		r.Error = "the probe's image: " + err.Error()
		return r
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err == nil {
		err = os.WriteFile(filepath.Join(bundle, "probe.c"), []byte(cudaProbe), 0o644)
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	b.withMarket(ctx, &r, "image", func(sub *api.Client, lender string) {
		spec := jobs.File{Name: "bench-gpu-image", Framework: "generic", Command: r.Command, Bundle: bundle, Image: oci,
			Workers: 1, Cores: 1, GPUs: 1, Memory: "1GiB", MaxPrice: "20", MaxDuration: "10m", MaxWait: "2m"}
		t0 := time.Now()
		j, err := sub.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
		if err != nil {
			r.Error = "submit: " + err.Error()
			return
		}
		for !j.State.Terminal() && ctx.Err() == nil {
			time.Sleep(time.Second)
			if cur, err := sub.Job(ctx, j.ID); err == nil {
				j = cur
			}
		}
		r.WallS, r.State = time.Since(t0).Seconds(), string(j.State)
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
		defer cancel()
		text := testbed.JobLog(bg, sub, j.ID)
		r.Log = filepath.Join(b.logs, "market-image-job.log")
		if err := os.WriteFile(r.Log, []byte(text), 0o644); err != nil {
			r.Log = ""
		}
		if b.cfg.Rehearsal && strings.Contains(text, "CUDA_FAIL dlopen libcuda.so.1") {
			log.Printf("   rehearsal: the probe ran in the image and found no driver, as expected here")
			return
		}
		if m := regexp.MustCompile(`CUDA_OK (\d+) (.*)`).FindStringSubmatch(text); j.State != jobs.Succeeded || m == nil {
			r.Error = fmt.Sprintf("the job %s (%s); the end of its log (%s):\n%s", j.State, j.Reason, r.Log, lastLines(text, 10))
		} else {
			log.Printf("   the worker in the image reached the GPU: %s GPU(s), %s", m[1], strings.TrimSpace(m[2]))
		}
	})
	return r
}

// probeImage compiles the CUDA probe with the host's C compiler and
// writes an OCI layout (in dir) of one layer: the probe at
// /usr/bin/cudaprobe, the libraries ldd lists for it and the C library's
// companions the driver loads (libm, libpthread, librt, libdl) at their
// host paths. It returns the layout's path.
func probeImage(ctx context.Context, dir string) (string, error) {
	src, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "cudaprobe")
	if err := os.WriteFile(src, []byte(cudaProbe), 0o644); err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, "cc", "-O2", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		return "", fmt.Errorf("cc: %v: %s", err, lastLines(string(out), 8))
	}
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return "", fmt.Errorf("ldd: %w", err)
	}
	files := map[string]string{"usr/bin/cudaprobe": bin}
	var libc string
	for _, p := range regexp.MustCompile(`(/\S+\.so[.0-9]*)`).FindAllString(string(out), -1) {
		files[strings.TrimPrefix(p, "/")] = p
		if strings.Contains(filepath.Base(p), "libc.so") {
			libc = filepath.Dir(p)
		}
	}
	for _, name := range []string{"libm.so.6", "libpthread.so.0", "librt.so.1", "libdl.so.2", "libgcc_s.so.1"} {
		if p := filepath.Join(libc, name); libc != "" && exists(p) {
			files[strings.TrimPrefix(p, "/")] = p
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		body, err := os.ReadFile(files[name])
		if err != nil {
			return "", err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body))}); err != nil {
			return "", err
		}
		if _, err := tw.Write(body); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	oci := filepath.Join(dir, "oci")
	p, err := layout.Write(oci, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	return oci, err
}
