package federationsender_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The queue delivers what others formatted: it depends on no domain
// package (keys, cross-signing, to-device, rooms).
func TestImportsNoDomain(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/keyserver/keyserver/federationsender").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/keyserver/keyserver/"
	for _, dep := range strings.Fields(string(out)) {
		pkg, ok := strings.CutPrefix(dep, mod)
		if !ok {
			continue
		}
		switch strings.Split(pkg, "/")[0] {
		case "federationsender", "fedclient", "storage", "internal":
		default:
			t.Errorf("federationsender depends on %s", dep)
		}
	}
}
