package metrics_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The metrics the domain counts, the domain and its background workers do
// not depend on the HTTP router: HTTP stays in the HTTP packages.
func TestDomainDoesNotDependOnRouter(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	pkgs := []string{
		"github.com/keyserver/keyserver/internal/metrics",
		"github.com/keyserver/keyserver/keyserver",
		"github.com/keyserver/keyserver/federationsender",
		"github.com/keyserver/keyserver/devicelist",
		"github.com/keyserver/keyserver/syncnotify",
		"github.com/keyserver/keyserver/crosssigning",
		"github.com/keyserver/keyserver/keybackup",
		"github.com/keyserver/keyserver/accountdata",
	}
	for _, pkg := range pkgs {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "github.com/gorilla/mux" {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
