// Package clientcompat drives the server with real client libraries, to
// prove that what they send is accepted and what they get back is what
// they expect. Its tests use mautrix-go with its pure-Go Olm, which needs
// the build tag goolm (make test sets it); without the tag they are left
// out of the build.
package clientcompat
