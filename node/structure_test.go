package node

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNodeStaysThin holds package node to wiring and lifecycle: a Node of
// few methods (its parts are built by functions that name what they
// need), short files and short functions, so that a change has one
// obvious place to go.
func TestNodeStaysThin(t *testing.T) {
	const maxMethods, maxFileLines, maxFuncLines = 20, 500, 80
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files here: %v", err)
	}
	var methods []string
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if lines := fset.Position(af.End()).Line; lines > maxFileLines {
			t.Errorf("%s is %d lines, over %d: split it by what its parts do", f, lines, maxFileLines)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines && !strings.HasSuffix(f, "_test.go") {
				t.Errorf("%s: %s is %d lines, over %d", f, fd.Name.Name, n, maxFuncLines)
			}
			if fd.Recv != nil && !strings.HasSuffix(f, "_test.go") {
				if star, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
					if id, ok := star.X.(*ast.Ident); ok && id.Name == "Node" {
						methods = append(methods, fd.Name.Name)
					}
				}
			}
		}
	}
	if len(methods) >= maxMethods {
		t.Errorf("*Node has %d methods, want under %d: %v; build a part with a function that takes what it needs, or move behaviour to its room", len(methods), maxMethods, methods)
	}
}

// TestRolesSpeakTheirOwnLanguage: no role imports the API's package or
// HTTP; node/api maps their errors (node/fault) to statuses.
func TestRolesSpeakTheirOwnLanguage(t *testing.T) {
	fset := token.NewFileSet()
	for _, room := range []string{"submitter", "lender", "market", "quoter", "jobs", "inventory", "sandbox", "fault"} {
		files, err := filepath.Glob(filepath.Join(room, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("room %s: no Go files", room)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if path == "net/http" || strings.HasSuffix(path, "/node/api") || strings.HasSuffix(path, "/node/service") {
					t.Errorf("%s imports %s: a role returns its own types and *fault.Error, and node/api maps them", f, path)
				}
			}
		}
	}
	if _, err := os.Stat("service"); err != nil {
		t.Fatal("node/service, where the API is answered, is missing")
	}
}
