package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const adminUsage = `keyserver admin COMMAND [flags] ARGS...  (flags before the arguments)

Commands (they work on the configured database, also while the daemon runs):
  create-user LOCALPART PASSWORD   create an account
  devices USER_ID                  list a local user's devices
  mark-stale USER_ID               resync a remote user's device list
  queue                            show the device-list updates waiting per server`

// runAdmin runs an operator command against the database.
func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "Usage: "+adminUsage)
		return fmt.Errorf("admin: a command is needed")
	}
	cmd := args[0]
	want := map[string]int{"create-user": 2, "devices": 1, "mark-stale": 1, "queue": 0}
	n, ok := want[cmd]
	if !ok {
		fmt.Fprintln(stderr, "Usage: "+adminUsage)
		return fmt.Errorf("admin: unknown command %q", cmd)
	}
	cfg, rest, err := loadConfig(args[1:], stderr, adminUsage)
	if err != nil {
		return err
	}
	if len(rest) != n {
		return fmt.Errorf("admin %s takes %d argument(s), not %d (try --help)", cmd, n, len(rest))
	}
	store, err := sqlstore.Open(ctx, cfg.DatabaseURI(), cfg.ServerName)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer store.Close()
	ks := keyserver.New(store, keyserver.Options{ServerName: cfg.ServerName, BcryptCost: cfg.ClientAPI.BcryptCost})
	switch cmd {
	case "create-user":
		userID, err := ks.CreateUser(ctx, rest[0], rest[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "created", userID)
	case "devices":
		devices, err := ks.UserDevices(ctx, rest[0])
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
	}
	return nil
}
