// Package api is the node's local HTTP/JSON API: the types that form the
// JSON contract of the CLI (DESIGN §9), the token-guarded server the node
// runs on loopback (with /metrics and /healthz), its OpenAPI description,
// and the client the CLI uses.
//
// api must not import node: node implements the small interfaces declared
// here and hands them to NewServer.
package api
