// Package service answers the node's local API: a type for each part of
// it (Status and About, Lending, Market, Data, Scheduling, Ledger, and
// Dashboard, which answers node/api's Dashboard and Validators), each
// built by node.Run from the parts of the node it reads, named in its
// fields. node/api's Jobs is the submitter's Manager, which node wraps.
//
// It is the only place where the roles' state becomes the API's documents:
// the roles (node/lender, node/market, node/submitter) know nothing of
// node/api, and node wires the parts together without answering requests
// itself. A failed request is a *fault.Error, which node/api maps to an
// HTTP status.
//
// service may import the roles, node/api and the libraries they use; no
// role may import service, and neither may node/api.
package service
