package sandbox

import (
	"fmt"
	"path"
	"strings"
)

// DefaultCgroupParent is the cgroup, under each hierarchy's root, that
// holds the jobs' cgroups unless [executor] cgroup_parent says otherwise.
const DefaultCgroupParent = "deepmarket"

// CheckCgroupParent checks a cgroup parent path: relative to the
// hierarchy's root, clean, without "." or ".." parts, and not a cgroup's
// interface file name.
func CheckCgroupParent(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("cgroup parent: empty")
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("cgroup parent %q: want a path relative to the cgroup root (no leading /)", p)
	case path.Clean(p) != p:
		return fmt.Errorf("cgroup parent %q: not a clean path (want %q)", p, path.Clean(p))
	}
	for _, part := range strings.Split(p, "/") {
		if part == "." || part == ".." {
			return fmt.Errorf("cgroup parent %q: %q parts are not allowed", p, part)
		}
		if strings.HasPrefix(part, "cgroup.") || strings.ContainsAny(part, "\x00\n") {
			return fmt.Errorf("cgroup parent %q: %q is not a cgroup name", p, part)
		}
	}
	return nil
}

// SetCgroupParent puts the jobs' cgroups under p (see CheckCgroupParent),
// relative to each hierarchy's root: a node that runs inside a cgroup of
// its own, as a machine of known size on a shared host does, gives one
// under it so that its jobs count against its machine's limits. Call it
// once, before the first job or Probe.
func SetCgroupParent(p string) error {
	if err := CheckCgroupParent(p); err != nil {
		return err
	}
	parentCgroup = p
	return nil
}
