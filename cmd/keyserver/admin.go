package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/keyserver/keyserver/internal/server"
)

const adminUsage = `keyserver admin COMMAND [flags] ARGS...  (flags before the arguments)

Commands (they work on the configured database, also while the daemon runs):
  create-user LOCALPART            create an account; the password is the first
                                   line of standard input, or is asked for
                                   (twice, not shown) when that is a terminal
  devices USER_ID                  list a local user's devices
  mark-stale USER_ID               resync a remote user's device list
  queue                            show the device-list updates waiting per server
  destinations                     list the servers with work waiting or failing
                                   deliveries: what waits, failed attempts, when
                                   the next try is due, which daemon sends
  retry SERVER_NAME                forget a server's failed deliveries so that
                                   what waits for it is sent now

'keyserver admin COMMAND --help' lists the flags.`

// runAdmin runs an operator command against the database.
func runAdmin(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stdout, "Usage: "+adminUsage)
		return fmt.Errorf("admin: a command is needed")
	}
	cmd := args[0]
	switch cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, "Usage: "+adminUsage)
		return nil
	}
	want := map[string]int{"create-user": 1, "devices": 1, "mark-stale": 1, "queue": 0, "destinations": 0, "retry": 1}
	n, ok := want[cmd]
	if !ok {
		fmt.Fprintln(stderr, "Usage: "+adminUsage)
		return fmt.Errorf("admin: unknown command %q", cmd)
	}
	cfg, rest, err := loadConfig(args[1:], stdout, stderr, adminUsage)
	if err != nil {
		return err
	}
	if cmd == "create-user" && len(rest) == 2 {
		// Not echoed: it is somebody's password.
		return errors.New("admin create-user takes no password on the command line, where other users and the shell history would see it: give it on standard input or at the prompt")
	}
	if len(rest) != n {
		return fmt.Errorf("admin %s takes %d argument(s), not %d (try --help)", cmd, n, len(rest))
	}
	var password string
	if cmd == "create-user" {
		if password, err = readPassword(stdin, stderr); err != nil {
			return err
		}
	}
	// The server as the daemon builds it, without identity files,
	// federation or background workers: the commands only read and write
	// the database.
	srv, err := server.Build(ctx, cfg, server.Options{})
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	ks, users := srv.Keys, srv.Users
	switch cmd {
	case "create-user":
		userID, err := users.CreateUser(ctx, rest[0], password)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "created", userID)
	case "devices":
		devices, err := users.UserDevices(ctx, rest[0])
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tKEYS\tNAME\tLAST SEEN IP")
		for _, d := range devices {
			name := ""
			if d.DisplayName != nil {
				name = *d.DisplayName
			}
			fmt.Fprintf(tw, "%s\t%v\t%s\t%s\n", d.DeviceID, d.HasKeys, name, d.LastSeenIP)
		}
		return tw.Flush()
	case "mark-stale":
		if err := ks.MarkStale(ctx, rest[0]); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "marked", rest[0], "for a resync")
	case "queue":
		q, err := ks.OutboundQueue(ctx)
		if err != nil {
			return err
		}
		dests := make([]string, 0, len(q))
		for d := range q {
			dests = append(dests, d)
		}
		sort.Strings(dests)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DESTINATION\tPENDING")
		for _, d := range dests {
			fmt.Fprintf(tw, "%s\t%d\n", d, q[d])
		}
		return tw.Flush()
	case "destinations":
		dests, err := ks.OutboundDestinations(ctx)
		if err != nil {
			return err
		}
		now := time.Now().UnixMilli()
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DESTINATION\tUPDATES\tTO-DEVICE\tEVENTS\tFAILED ATTEMPTS\tFAILING SINCE\tNEXT TRY IN\tLEASE")
		for _, d := range dests {
			since, next := "-", "-"
			if d.Retry.Attempts > 0 {
				since = time.UnixMilli(d.Retry.FailingSince).UTC().Format(time.RFC3339)
				next = "now"
				if d.Retry.RetryAt > now {
					next = (time.Duration(d.Retry.RetryAt-now) * time.Millisecond).Round(time.Second).String()
				}
			}
			lease := "-"
			switch {
			case d.LeaseOwner != "" && d.LeaseExpires == 0:
				lease = d.LeaseOwner + " (waiting to retry)"
			case d.LeaseOwner != "":
				lease = d.LeaseOwner
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", d.Destination, d.Updates, d.ToDevice, d.PDUs,
				d.Retry.Attempts, since, next, lease)
		}
		return tw.Flush()
	case "retry":
		had, err := ks.RetryDestination(ctx, rest[0])
		if err != nil {
			return err
		}
		if had {
			fmt.Fprintln(stdout, "forgot the failures of", rest[0]+"; what waits for it is sent now")
		} else {
			fmt.Fprintln(stdout, rest[0], "has no failed deliveries; nothing to retry")
		}
	}
	return nil
}

// maxPasswordInput bounds what is read from standard input for a password
// (the domain refuses long passwords anyway).
const maxPasswordInput = 64 << 10

// readPassword reads a new account's password: at a prompt without echo,
// twice, when stdin is a terminal; otherwise the first line of stdin,
// without its line ending, so that "printf '%s\n' pw |" and a file both work.
func readPassword(stdin io.Reader, prompts io.Writer) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		ask := func(prompt string) (string, error) {
			fmt.Fprint(prompts, prompt)
			pw, err := term.ReadPassword(int(f.Fd()))
			fmt.Fprintln(prompts)
			if err != nil {
				return "", fmt.Errorf("read the password: %w", err)
			}
			return string(pw), nil
		}
		pw, err := ask("Password: ")
		if err != nil {
			return "", err
		}
		again, err := ask("Password again: ")
		if err != nil {
			return "", err
		}
		if pw != again {
			return "", errors.New("the passwords differ")
		}
		return pw, nil
	}
	if stdin == nil {
		return "", errors.New("no password on standard input")
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, maxPasswordInput)).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		if errors.Is(err, io.EOF) {
			return "", errors.New("no password on standard input")
		}
		return "", fmt.Errorf("read the password from standard input: %w", err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}
