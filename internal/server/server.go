// Package server builds the server from its configuration: the domain
// services, their background workers and the two HTTP handlers. The
// daemon, the test helpers and the admin commands all build it here.
package server

import "github.com/keyserver/keyserver/keyserver"

// DehydratedKeys is the keys domain as dehydrated devices use it.
func DehydratedKeys(ks *keyserver.Service) dehydratedKeys { return dehydratedKeys{ks} }
