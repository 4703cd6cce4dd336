// Package web is the dashboard every node serves (DeepMarket's successor to
// PLUTO): two HTML documents and the hand-written CSS and JavaScript modules
// they load, embedded in the binary. There is no build step and nothing is
// fetched from elsewhere at run time.
//
// The node's API server (package node/api) serves it: index.html, a
// template given the session's CSRF token, for every page path; login.html
// for signing in; assets/ as static files. The scripts read and change the
// node only through the JSON API under /api/v1 and its server-sent events.
//
// web imports nothing of DeepMarket's.
package web
