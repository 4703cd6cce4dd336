package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// IDRange is a range of uids, First to Last inclusive, from which each job
// gets one of its own (and the gid of the same number). No account may use
// them: a job's uid owns nothing on the machine but the job's own dir.
type IDRange struct {
	First, Last int
}

// DefaultIDRange is the range jobs run in unless [executor] uid_range says
// otherwise. It lies where no convention allocates: above Debian's and
// login.defs' users (up to 60000) and Debian's on-demand ids (60000-64999),
// clear of systemd's DynamicUser range (61184-65519), nobody (65534) and the
// subordinate ids that useradd hands out from 100000.
const DefaultIDRange = "70000-70999"

// DefaultIDs is DefaultIDRange parsed.
var DefaultIDs = IDRange{First: 70000, Last: 70999}

// maxID keeps clear of uids that tools mistake for negative numbers.
const maxID = 1<<31 - 1

// ParseIDRange parses "FIRST-LAST" (e.g. DefaultIDRange) and checks that
// the range is usable for jobs: above the system ids, without nobody, at
// most a million ids.
func ParseIDRange(s string) (IDRange, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil {
		return IDRange{}, fmt.Errorf("%q: want FIRST-LAST, such as %q", s, DefaultIDRange)
	}
	r := IDRange{First: first, Last: last}
	switch {
	case first < 1000:
		return IDRange{}, fmt.Errorf("%q: ids below 1000 belong to the system; such as %q", s, DefaultIDRange)
	case last < first:
		return IDRange{}, fmt.Errorf("%q: the last id is below the first", s)
	case last > maxID:
		return IDRange{}, fmt.Errorf("%q: ids above %d are read as negative by some tools", s, maxID)
	case last-first >= 1_000_000:
		return IDRange{}, fmt.Errorf("%q: at most a million ids", s)
	case r.Contains(65534) || r.Contains(65535):
		return IDRange{}, fmt.Errorf("%q: holds 65534 (nobody) or 65535 (the invalid id)", s)
	}
	return r, nil
}

// String renders the range as ParseIDRange reads it.
func (r IDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Contains reports whether id is in the range.
func (r IDRange) Contains(id int) bool { return id >= r.First && id <= r.Last }

// Len is the number of ids in the range.
func (r IDRange) Len() int { return r.Last - r.First + 1 }

// Check refuses a range that an account in /etc/passwd or a group in
// /etc/group already uses: a job running as that id would own the
// account's files. (Accounts from a directory service such as LDAP are
// checked as each id is leased.)
func (r IDRange) Check() error {
	for _, db := range []struct{ path, what string }{{"/etc/passwd", "user"}, {"/etc/group", "group"}} {
		name, id, err := firstInRange(db.path, r)
		if err != nil {
			return err
		}
		if name != "" {
			return fmt.Errorf("%s: %s %q has id %d in %s: pick a range no account uses", r, db.what, name, id, db.path)
		}
	}
	return nil
}

// firstInRange finds the first entry of a passwd or group file whose id
// (the third field) is in r.
func firstInRange(path string, r IDRange) (string, int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 {
			continue
		}
		if id, err := strconv.Atoi(fields[2]); err == nil && r.Contains(id) {
			return fields[0], id, nil
		}
	}
	return "", 0, sc.Err()
}
