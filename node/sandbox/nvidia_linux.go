package sandbox

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// A GPU job in an image gets the host's NVIDIA driver: its user-space
// libraries and tools match the kernel module, so they cannot come with
// the image. As nvidia-container-toolkit does, the node binds the host's
// into the image, read-only: the libraries at nvidiaLibDir and the tools
// at nvidiaBinDir, the paths NVIDIA's CUDA images already put on
// LD_LIBRARY_PATH and PATH (the job's environment gets them too).
const (
	nvidiaDir    = "/usr/local/nvidia"
	nvidiaLibDir = nvidiaDir + "/lib64"
	nvidiaBinDir = nvidiaDir + "/bin"
)

// driverLibs are the driver's libraries by soname prefix (those
// nvidia-container-cli lists for the compute and utility capabilities).
var driverLibs = []string{
	"libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
	"libnvidia-gpucomp.so", "libnvidia-cfg.so", "libnvidia-allocator.so", "libnvidia-opencl.so",
}

// driverBins are the driver's tools a job may run.
var driverBins = []string{"nvidia-smi", "nvidia-debugdump"}

// driverFiles lists the host's driver libraries and tools (absolute
// paths), found once: nvidia-container-cli's list when the toolkit is
// installed, else the dynamic linker's cache (ldconfig -p) and PATH; a
// host whose cache lists no driver (a container that finds it through
// LD_LIBRARY_PATH) is searched in that path and in nvidiaLibDir. A
// variable, so that tests can give a machine without a GPU a driver.
var driverFiles = sync.OnceValues(findDriverFiles)

func findDriverFiles() (libs, bins []string) {
	if out, err := exec.Command("nvidia-container-cli", "list", "--libraries", "--binaries").Output(); err == nil {
		for _, p := range strings.Fields(string(out)) {
			if strings.Contains(filepath.Base(p), ".so") {
				libs = append(libs, p)
			} else {
				bins = append(bins, p)
			}
		}
		return libs, bins
	}
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		libs = driverLibsIn(out)
	}
	if len(libs) == 0 {
		libs = driverLibsInDirs(append(filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")), nvidiaLibDir))
	}
	for _, b := range driverBins {
		if p, err := exec.LookPath(b); err == nil {
			bins = append(bins, p)
		}
	}
	return libs, bins
}

// driverLibsIn picks the driver's 64-bit libraries out of `ldconfig -p`:
// lines such as "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".
func driverLibsIn(ldconfig []byte) []string {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(ldconfig))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), " (")
		if !ok {
			continue
		}
		flags, path, ok := strings.Cut(rest, ") => ")
		if !ok || !strings.Contains(flags, "64") || !filepath.IsAbs(path) {
			continue
		}
		for _, prefix := range driverLibs {
			if strings.HasPrefix(name, prefix) {
				libs = append(libs, path)
				break
			}
		}
	}
	return libs
}

// driverLibsInDirs picks the driver's libraries out of the absolute
// directories dirs, each name once (the first directory's).
func driverLibsInDirs(dirs []string) []string {
	var libs []string
	seen := map[string]bool{}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			continue
		}
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			name := e.Name()
			if seen[name] || e.IsDir() {
				continue
			}
			for _, prefix := range driverLibs {
				if strings.HasPrefix(name, prefix) {
					seen[name] = true
					libs = append(libs, filepath.Join(d, name))
					break
				}
			}
		}
	}
	return libs
}

// driverArgs bind the host's driver into an image's root for a job with
// GPUs: a tmpfs at nvidiaDir holding each library and tool, read-only,
// by its own name (a soname link bound as the file it names).
func driverArgs(libs, bins []string) []string {
	if len(libs)+len(bins) == 0 {
		return nil
	}
	args := []string{"--tmpfs", nvidiaDir}
	for _, l := range libs {
		args = append(args, "--ro-bind-try", l, filepath.Join(nvidiaLibDir, filepath.Base(l)))
	}
	for _, b := range bins {
		args = append(args, "--ro-bind-try", b, filepath.Join(nvidiaBinDir, filepath.Base(b)))
	}
	return append(args, "--remount-ro", nvidiaDir)
}

// withDriverPaths puts the driver's dirs on a GPU job's LD_LIBRARY_PATH
// (first, so that they win over a stub the image may carry) and PATH.
func withDriverPaths(ldPath, path string) (string, string) {
	if !strings.Contains(":"+ldPath+":", ":"+nvidiaLibDir+":") {
		ldPath = strings.TrimSuffix(nvidiaLibDir+":"+ldPath, ":")
	}
	if !strings.Contains(":"+path+":", ":"+nvidiaBinDir+":") {
		path += ":" + nvidiaBinDir
	}
	return ldPath, path
}
