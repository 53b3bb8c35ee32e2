package sqlstore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var placeholderRE = regexp.MustCompile(`\$(\d+)`)

// placeholdersInOrder reports the first $n that appears before $1..$n-1.
func placeholdersInOrder(q string) (count int, bad string) {
	next := 1
	seen := map[int]bool{}
	for _, m := range placeholderRE.FindAllStringSubmatch(q, -1) {
		n, _ := strconv.Atoi(m[1])
		if seen[n] {
			continue
		}
		if n != next {
			return count, "$" + m[1] + " appears before $" + strconv.Itoa(next)
		}
		seen[n] = true
		next++
		count++
	}
	return count, ""
}

// SQLite binds $n placeholders by order of first appearance, not by n, so
// every query must introduce $1, $2, ... in that order. This checks every
// SQL string of the package: the queries assembled with fmt by value, the
// rest by reading the source (concatenated literals folded; a literal joined
// to a value, such as a dialect's FOR UPDATE, checked on its own).
func TestPlaceholdersAppearInOrder(t *testing.T) {
	checked := 0
	byValue := map[string]string{"changedQuery": changedQuery, "leftQuery": leftQuery, "syncDataQuery": syncDataQuery}
	for name, q := range byValue {
		n, bad := placeholdersInOrder(q)
		if bad != "" {
			t.Errorf("%s: %s", name, bad)
		}
		checked += n
	}
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			var q string
			switch e := n.(type) {
			case *ast.ValueSpec:
				for _, id := range e.Names {
					if _, ok := byValue[id.Name]; ok {
						return false // checked by value above
					}
				}
				return true
			case *ast.BinaryExpr:
				s, ok := fold(e)
				if !ok {
					return true // check the literal parts one by one
				}
				q = s
			case *ast.BasicLit:
				if e.Kind != token.STRING {
					return true
				}
				q, _ = strconv.Unquote(e.Value)
			default:
				return true
			}
			c, bad := placeholdersInOrder(q)
			if bad != "" {
				t.Errorf("%s: %s in %q", fset.Position(n.Pos()), bad, q)
			}
			checked += c
			return false
		})
	}
	if checked < 40 {
		t.Fatalf("only %d placeholders found; is the check reading the SQL?", checked)
	}
}

// fold concatenates a + chain of string literals.
func fold(e ast.Expr) (string, bool) {
	switch x := e.(type) {
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(x.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if x.Op != token.ADD {
			return "", false
		}
		l, ok := fold(x.X)
		if !ok {
			return "", false
		}
		r, ok := fold(x.Y)
		return l + r, ok
	case *ast.ParenExpr:
		return fold(x.X)
	}
	return "", false
}
