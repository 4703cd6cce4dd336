// Package api is the node's local HTTP/JSON API: the types that form the
// JSON contract of the CLI (docs/architecture.md), the server the node runs on
// loopback (with /metrics and /healthz), its OpenAPI description, and the
// client the CLI uses. The server also serves the dashboard (the files of
// package node/web), its sessions (session.go: one-time login links,
// cookies, CSRF checks), the routes only the dashboard needs (dashboard.go)
// and its server-sent events (events.go).
//
// The CLI authenticates with the bearer token in api.token; a browser with
// a session from a login link that only the token can mint.
//
// api must not import node: node/service answers the small interfaces
// declared here (the submitter's Manager answers Jobs, wrapped), and node
// hands those answers to NewServer.
package api
