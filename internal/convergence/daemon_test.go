package convergence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/faultproxy"
)

const adminToken = "convergence-admin-token"

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// daemonBinary builds ./cmd/keyserver once per test binary, so that each
// daemon is a process of its own that kill -9 really kills.
func daemonBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "keyserver-convergence-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "keyserver")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		cmd := exec.Command(goTool, "build", "-o", binary, "github.com/keyserver/keyserver/cmd/keyserver")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/keyserver: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// freeAddr returns a loopback address with a port nothing listens on now,
// for a daemon to listen on later. The port is below Linux's ephemeral
// range (32768 and up), where the kernel picks the ports of outgoing
// connections and of listeners on port 0: the other tests running at the
// same time cannot take it meanwhile.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		addr := "127.0.0.1:" + strconv.Itoa(20000+mrand.IntN(12000))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken
		}
		ln.Close()
		return addr
	}
	t.Fatal("no free port found below the ephemeral range")
	return ""
}

// server is one Matrix server: a fault proxy listening on its name, and
// one daemon, or two sharing a PostgreSQL database.
type server struct {
	label string
	name  string // the proxy's address
	proxy *faultproxy.Proxy
	procs []*proc
	users []*user
}

// proc is one daemon process.
type proc struct {
	label      string
	srv        *server
	binary     string
	dir        string
	configPath string
	clientURL  string
	fedAddr    string
	logPath    string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

// newProc prepares a daemon of srv on database (empty: SQLite in its data
// directory). Instances of one server share signingKey.
func newProc(t *testing.T, srv *server, label, database, signingKey string) *proc {
	t.Helper()
	dir := filepath.Join(t.TempDir(), label)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &proc{label: label, srv: srv, binary: daemonBinary(t), dir: dir, configPath: filepath.Join(dir, "keyserver.yaml"),
		clientURL: "http://" + freeAddr(t), fedAddr: freeAddr(t), logPath: filepath.Join(dir, "daemon.log")}
	// Default settings but for what loopback tests need: the addresses,
	// trust of self-signed certificates, loopback allowed as a
	// destination, no rate limits on the test's clients, cheap bcrypt,
	// device names shown over federation (so renames are compared too).
	cfg := fmt.Sprintf(`server_name: %q
data_dir: %q
database: %q
admin_token: %q
signing_key_path: %q
log:
  level: info
client_api:
  listen: %q
  bcrypt_cost: 4
  rate_limit_per_second: 0
  login_rate_limit: {per_second: 0}
  registration_rate_limit: {per_second: 0}
  failed_login_rate_limit: {per_second: 0}
federation:
  listen: %q
  tls_insecure_skip_verify: true
  allow_device_names: true
  ip_range_allowlist: ["127.0.0.0/8"]
`, srv.name, filepath.Join(dir, "data"), database, adminToken, signingKey, strings.TrimPrefix(p.clientURL, "http://"), p.fedAddr)
	if err := os.WriteFile(p.configPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start starts the daemon and waits until it answers.
func (p *proc) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.starts++
	fmt.Fprintf(logf, "==== start %d\n", p.starts)
	cmd := exec.Command(p.binary, "--config", p.configPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.clientURL + "/_matrix/client/versions")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("%s exited at start:\n%s", p.label, p.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer after 60 s:\n%s", p.label, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether the process runs.
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill kills the daemon with SIGKILL and waits for it to be gone.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop ends the daemon gently (SIGTERM), or by SIGKILL after 20 s.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// logTail returns the end of the daemon's log.
func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// logLines returns the lines of the daemon's log containing s.
func (p *proc) logLines(s string) []string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// errDown is returned for a request to a daemon that is not running.
var errDown = errors.New("daemon down")

var httpClient = &http.Client{Timeout: 30 * time.Second}

// call sends a client API request; err is set when no answer came.
func (p *proc) call(ctx context.Context, method, path, token string, body any) (int, map[string]any, error) {
	if !p.alive() {
		return 0, nil, errDown
	}
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.clientURL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("answer is not JSON (%d): %s", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, out, nil
}

// pidOfPeer finds which of pids has the TCP connection whose local end is
// the loopback address addr (as a proxy sees its sender), from /proc; 0
// if none (or not on Linux).
func pidOfPeer(addr string, pids []int) int {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return 0
	}
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	inode := ""
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == want {
			inode = f[9]
			break
		}
	}
	if inode == "" || inode == "0" {
		return 0
	}
	link := "socket:[" + inode + "]"
	for _, pid := range pids {
		fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
		for _, fd := range fds {
			if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); err == nil && l == link {
				return pid
			}
		}
	}
	return 0
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}
