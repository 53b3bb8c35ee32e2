// Package clientcompat drives the server with real client libraries, to
// prove that what they send is accepted and what they get back is what
// they expect. Its tests use mautrix-go with its pure-Go Olm, which needs
// the build tag goolm (make test sets it); without the tag they are left
// out of the build. matrix-js-sdk's start-up is replayed call by call
// over HTTP (jssdk_startup_test.go), which needs no tag.
package clientcompat
