// Package docs checks the project's documents against its code.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// decls is what the repository's Go code declares: per package name, its
// top-level names; per type, its methods and fields; and every name at all.
type decls struct {
	pkgs    map[string]map[string]bool // package -> top-level names
	members map[string]map[string]bool // "pkg.Type" -> methods and fields
	typeMem map[string]map[string]bool // "Type" -> methods and fields, any package
	any     map[string]bool            // every declared name
}

func declsOf(t *testing.T, root string) *decls {
	d := &decls{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{}, typeMem: map[string]map[string]bool{}, any: map[string]bool{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
		d.any[v] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); n != "." && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "python" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			switch x := decl.(type) {
			case *ast.FuncDecl:
				if x.Recv == nil {
					add(d.pkgs, pkg, x.Name.Name)
					continue
				}
				typ := recvType(x.Recv.List[0].Type)
				add(d.members, pkg+"."+typ, x.Name.Name)
				add(d.typeMem, typ, x.Name.Name)
			case *ast.GenDecl:
				for _, spec := range x.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(d.pkgs, pkg, s.Name.Name)
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, f := range st.Fields.List {
								for _, n := range f.Names {
									add(d.members, pkg+"."+s.Name.Name, n.Name)
									add(d.typeMem, s.Name.Name, n.Name)
								}
								if len(f.Names) == 0 { // embedded: its name is its type's
									add(d.members, pkg+"."+s.Name.Name, recvType(f.Type))
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(d.pkgs, pkg, n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The Python package's classes and functions count as declared too.
	py := regexp.MustCompile(`(?m)^\s*(?:class|def) ([A-Za-z_][A-Za-z0-9_]*)`)
	err = filepath.WalkDir(filepath.Join(root, "python", "deepmarket"), func(path string, e fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(path, ".py") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range py.FindAllSubmatch(b, -1) {
			d.any[string(m[1])] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.IndexListExpr:
		return recvType(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// goName is a backticked name that reads as Go: pkg.Name, pkg.Type.Member,
// Type.Member, or a CamelCase name, optionally called ("()").
var goName = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*){0,2})(?:\\(\\))?`")

// TestArchitectureNamesResolve: every Go identifier docs/architecture.md
// names in backticks is declared in the code: pkg.Name in that package,
// pkg.Type.Member on that type, Type.Member on a type of that name, and a
// bare CamelCase name somewhere. A rename that leaves the doc behind fails
// here. Names of the standard library and of other modules (os.Root,
// context.Context) are left alone.
func TestArchitectureNamesResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	d := declsOf(t, root)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, m := range goName.FindAllStringSubmatch(string(doc), -1) {
		parts := strings.Split(m[1], ".")
		ok, judged := d.resolve(parts)
		if !judged {
			continue
		}
		checked++
		if !ok {
			t.Errorf("docs/architecture.md names `%s`, which the code does not declare", m[1])
		}
	}
	if checked < 40 {
		t.Errorf("checked %d names: the extraction is broken", checked)
	}
}

// resolve says whether parts names something declared, and whether it
// reads as a Go name of this repository at all.
func (d *decls) resolve(parts []string) (ok, judged bool) {
	exported := func(s string) bool { return s != "" && s[0] >= 'A' && s[0] <= 'Z' }
	for _, p := range parts { // an environment variable, a constant of another language
		if strings.ToUpper(p) == p && strings.Contains(p, "_") {
			return false, false
		}
	}
	camel := func(s string) bool { return strings.ContainsAny(s[1:], "ABCDEFGHIJKLMNOPQRSTUVWXYZ") }
	if names, isPkg := d.pkgs[parts[0]]; isPkg && len(parts) > 1 {
		switch {
		case !exported(parts[1]) && !camel(parts[1]): // a file (node.key), a field in prose
			return false, false
		case len(parts) == 2:
			return names[parts[1]], true
		default:
			return d.members[parts[0]+"."+parts[1]][parts[2]], true
		}
	}
	switch {
	case len(parts) == 1 && camel(parts[0]): // startHolder, FailureSettle: somewhere
		return d.any[parts[0]], true
	case len(parts) == 2 && exported(parts[0]) && d.typeMem[parts[0]] != nil:
		return d.typeMem[parts[0]][parts[1]], true
	}
	return false, false
}
