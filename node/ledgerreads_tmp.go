package node

import (
	"context"
	"encoding/json"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

// queryReads answers ledgerReads through the app's ABCI queries.
// TEMPORARY: replaced by the ledger's own in-process reads.
type queryReads struct{ app *ledger.App }

func (q queryReads) q(path string, v any) bool {
	res, err := q.app.Query(context.Background(), &abci.RequestQuery{Path: path})
	return err == nil && res.Code == 0 && json.Unmarshal(res.Value, v) == nil
}

func (q queryReads) account(a identity.Address) (ledger.Account, bool) {
	var acct ledger.Account
	ok := q.q("/account/"+string(a), &acct)
	return acct, ok && (acct.Balance > 0 || acct.Nonce > 0)
}

func (q queryReads) MachineOwner(m identity.Address) (identity.Address, bool) {
	var link map[string]string
	if !q.q("/link/"+string(m), &link) {
		return "", false
	}
	owner := identity.Address(link["owner"])
	_, ok := q.account(owner)
	return owner, ok
}

func (q queryReads) IsMember(a identity.Address) bool { _, ok := q.account(a); return ok }

func (q queryReads) BalanceOf(a identity.Address) uint64 {
	acct, _ := q.account(a)
	return acct.Balance
}
