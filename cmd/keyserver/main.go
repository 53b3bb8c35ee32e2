// Command keyserver runs the Matrix end-to-end-encryption key server.
//
//	keyserver [--config FILE] [--server-name NAME] [--client-listen ADDR] ...
//	keyserver generate-config > keyserver.yaml
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/daemon"
)

// gcPercent is the garbage collector's target unless GOGC is set. The
// live heap is small (caches, pooled buffers), so the default of 100 runs
// a collection every few megabytes of request garbage; 200 halves that for
// about 6 MB more resident memory, which measured 20-30 % more requests/s.
// Room messages make ~100 KB of garbage each (canonical JSON, signing):
// 400, a collection every ~80 MB at a 20 MB live heap, measured 3-11 %
// more messages/s on PostgreSQL than 200, and 800 no more than 400.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "keyserver:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is 0 for success and for --help (the usage was asked for and
// printed), 1 otherwise.
func exitCode(err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}

// aliases are the short flag names for the most used keys; every key is
// also a flag under its full dotted name with "." and "_" written "-".
var aliases = map[string]string{
	"client-listen": "client_api.listen",
	"registration":  "client_api.registration",
}

func flagName(key string) string {
	return strings.NewReplacer(".", "-", "_", "-").Replace(key)
}

// keyFlag collects a flag's value for one configuration key; values are
// applied after the file is read, so flags win over the file.
type keyFlag struct {
	key    string
	isBool bool
	set    map[string]string
}

func (f *keyFlag) String() string { return "" }
func (f *keyFlag) Set(v string) error {
	f.set[f.key] = v
	return nil
}
func (f *keyFlag) IsBoolFlag() bool { return f.isBool }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "generate-config" {
		_, err := stdout.Write(config.DefaultYAML())
		return err
	}
	if len(args) > 0 && args[0] == "admin" {
		return runAdmin(ctx, args[1:], stdin, stdout, stderr)
	}
	cfg, rest, err := loadConfig(args, stdout, stderr, "keyserver [flags]\n       keyserver generate-config\n       keyserver admin COMMAND [flags] ARGS...")
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q (try --help)", rest[0])
	}
	log, err := daemon.NewLogger(cfg)
	if err != nil {
		return err
	}
	log.SetOutput(stderr)
	d, err := daemon.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-d.Errors():
		log.WithError(serveErr).Error("listener failed; shutting down")
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(serveErr, d.Shutdown(shutdownCtx))
}

// loadConfig reads the configuration the way every command does: the file
// named by --config, then the flags on top, then validation. It returns the
// arguments left after the flags. The usage goes to stdout when --help
// asked for it, to stderr after a mistake.
func loadConfig(args []string, stdout, stderr io.Writer, usage string) (*config.Config, []string, error) {
	fs := flag.NewFlagSet("keyserver", flag.ContinueOnError)
	var flagOut bytes.Buffer
	fs.SetOutput(&flagOut)
	configPath := fs.String("config", "", "read the configuration from this YAML `file` (see 'keyserver generate-config')")
	values := map[string]string{}
	defaults := config.Default()
	for _, key := range config.Keys() {
		fs.Var(&keyFlag{key: key, set: values, isBool: isBoolKey(defaults, key)}, flagName(key), "sets configuration key "+key)
	}
	aliasNames := make([]string, 0, len(aliases))
	for a := range aliases {
		aliasNames = append(aliasNames, a)
	}
	sort.Strings(aliasNames)
	for _, a := range aliasNames {
		key := aliases[a]
		fs.Var(&keyFlag{key: key, set: values, isBool: isBoolKey(defaults, key)}, a, "same as --"+flagName(key))
	}
	fs.Usage = func() {
		fmt.Fprintf(&flagOut, "Usage: %s\n\nFlags (each overrides the configuration key it names):\n", usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stdout.Write(flagOut.Bytes())
		} else {
			_, _ = stderr.Write(flagOut.Bytes())
		}
		return nil, nil, err
	}
	cfg := config.Default()
	var loadErr error // values of the file that did not fit, reported with the rest
	if *configPath != "" {
		if cfg, loadErr = config.Load(*configPath); cfg == nil {
			return nil, nil, loadErr
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	problems := []error{loadErr}
	for _, k := range keys {
		if err := cfg.Set(k, values[k]); err != nil {
			problems = append(problems, fmt.Errorf("--%s: %s", flagName(k), strings.TrimPrefix(err.Error(), "config: ")))
		}
	}
	if err := config.Problems(append(problems, cfg.Validate())...); err != nil {
		return nil, nil, err
	}
	return cfg, fs.Args(), nil
}

// isBoolKey reports whether a key holds a boolean, so its flag may be
// given without a value.
func isBoolKey(c *config.Config, key string) bool {
	probe := *c
	return probe.Set(key, "true") == nil && probe.Set(key, "maybe") != nil && probe.Set(key, "1") == nil
}
