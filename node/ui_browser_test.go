package node

// The dashboard driven in a real browser (browser_test.go) as a lab user
// would, against real nodes on loopback.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/market"
)

// TestDashboardNeedsASession: without a session every page sends the
// browser to the login page and the API refuses; a login link works once;
// a session's state-changing calls need its CSRF token; the session cannot
// mint links; signing out ends it.
func TestDashboardNeedsASession(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	n := startNode(t, initHome(t, filepath.Join(t.TempDir(), "solo"), testNet(t)))
	tb := b.tab(n, true)

	// No session: each page goes to the login page, and the API says 401.
	for _, p := range []string{"/", "/resources", "/jobs", "/market", "/ledger", "/network", "/jobs/abcdef"} {
		tb.do("open "+p, chromedp.Navigate(tb.base()+p))
		tb.wait(10*time.Second, p+" to send us to the login page", `location.pathname === "/login" && document.querySelector("#login-help")`)
	}
	if st := js[int](tb, `fetch("/api/v1/status").then((r) => r.status)`); st != http.StatusUnauthorized {
		t.Errorf("GET /api/v1/status without a session: %d, want 401", st)
	}
	if st := js[int](tb, `fetch("/api/v1/jobs", {method: "POST", body: "{}"}).then((r) => r.status)`); st != http.StatusUnauthorized {
		t.Errorf("POST /api/v1/jobs without a session: %d, want 401", st)
	}
	tb.shot("login")
	plain := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := plain.Get(tb.base() + "/market")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Errorf("GET /market without a session: %d to %q, want 303 to /login", resp.StatusCode, resp.Header.Get("Location"))
	}

	// A made-up link is refused.
	tb.do("bogus link", chromedp.Navigate(tb.base()+"/login?t=not-a-token"))
	tb.waitText(10*time.Second, "#login-error", "expired or was used")

	// A real one signs in, once.
	link, err := n.client.LoginLink(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tb.do("open the login link", chromedp.Navigate(link.URL))
	tb.wait(15*time.Second, "the dashboard", `document.querySelector('#main[data-page="dashboard"]')`)
	bal, err := n.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	tb.wait(15*time.Second, "the balance", fmt.Sprintf(`document.querySelector("#balance")?.dataset.micro === "%d"`, bal.Balance))
	cookies := js[string](tb, `document.cookie`)
	if strings.Contains(cookies, "dm_session") {
		t.Errorf("the session cookie is readable by scripts: %q", cookies)
	}
	resp, err = plain.Get(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "expired or was used") {
		t.Errorf("a login link used twice: %d %s", resp.StatusCode, body)
	}

	// The session reads the API; it changes things only with its CSRF
	// token; it cannot make login links.
	if st := js[int](tb, `fetch("/api/v1/status").then((r) => r.status)`); st != http.StatusOK {
		t.Errorf("GET /api/v1/status with a session: %d", st)
	}
	if st := js[int](tb, `fetch("/api/v1/lend", {method: "DELETE"}).then((r) => r.status)`); st != http.StatusForbidden {
		t.Errorf("DELETE /api/v1/lend without the CSRF token: %d, want 403", st)
	}
	csrf := `document.querySelector('meta[name="csrf-token"]').content`
	if st := js[int](tb, `fetch("/api/v1/lend", {method: "DELETE", headers: {"X-CSRF-Token": `+csrf+`}}).then((r) => r.status)`); st != http.StatusOK {
		t.Errorf("DELETE /api/v1/lend with the CSRF token: %d, want 200", st)
	}
	if st := js[int](tb, `fetch("/api/v1/ui/login-link", {method: "POST", headers: {"X-CSRF-Token": `+csrf+`}}).then((r) => r.status)`); st != http.StatusUnauthorized {
		t.Errorf("a session asking for a login link: %d, want 401", st)
	}

	// Signing out ends the session.
	tb.do("sign out", chromedp.Click(chromedp.ID("logout"), chromedp.NodeVisible))
	tb.wait(10*time.Second, "the login page", `location.pathname === "/login"`)
	if st := js[int](tb, `fetch("/api/v1/status").then((r) => r.status)`); st != http.StatusUnauthorized {
		t.Errorf("GET /api/v1/status after signing out: %d, want 401", st)
	}
	// The CLI's token still works.
	if _, err := n.client.Status(t.Context()); err != nil {
		t.Errorf("the bearer token after the dashboard: %v", err)
	}
}

// startUICluster is a submitter and one lender on the submitter's ledger;
// the lender lends nothing yet (the test lends through the dashboard).
func startUICluster(t *testing.T, python string) (sub, lender *testNode) {
	t.Helper()
	chain := testNet(t)
	dir := t.TempDir()
	withExec := execOpts(t, python)
	sh := initHome(t, filepath.Join(dir, "submitter"), chain)
	sub = startNode(t, sh, withExec("submitter", 0))
	st := sub.Status()
	lh := Home{Dir: filepath.Join(dir, "lender")}
	if _, err := Init(lh, InitOptions{
		Moniker: "lender", Site: "lab-b", Genesis: sh.GenesisPath(), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
		LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
		LedgerPeers: []string{st.LedgerNodeID + "@127.0.0.1:" + sub.cfg.Ledger.P2PListen[len("tcp://127.0.0.1:"):]},
	}); err != nil {
		t.Fatal(err)
	}
	lender = startNode(t, lh, withBootstrap(sub.addr()), withExec("lender", 1))
	admit(t, sub, lender)
	registered(t, lender)
	eventually(t, 30*time.Second, "the lender to join", func() bool { return len(sub.PeerIDs()) > 0 })
	return sub, lender
}

// TestDashboardLendSubmitAndPages drives the dashboard as a lab user would:
// a bad lend is refused beside its field and lends nothing; lending through
// the form puts the machine on the other node's Market page (live); a
// generic job submitted through the form (bundle uploaded) shows its
// quote, runs once confirmed, and its log, result and the balance follow
// without reloading; then every page is photographed.
func TestDashboardLendSubmitAndPages(t *testing.T) {
	py := uiPython(t)
	b := newBrowser(t)
	defer func(d time.Duration) { market.PriceSampleEvery = d }(market.PriceSampleEvery)
	market.PriceSampleEvery = time.Second
	sub, lender := startUICluster(t, py)

	market := b.tab(sub, true) // the submitter watches the market
	market.login()
	market.nav("/market", "market")
	market.waitText(10*time.Second, "#offers", "No offers")

	lend := b.tab(lender, false)
	lend.login()
	lend.nav("/resources", "resources")
	lend.wait(15*time.Second, "the inventory", `document.querySelector("#inventory-list")`)

	// More cores than the machine has: refused beside the field.
	inv := lender.Inventory()
	lend.do("fill the lend form with too many cores",
		chromedp.SetValue(chromedp.ID("f-cores"), fmt.Sprint(inv.Cores+3)),
		chromedp.SetValue(chromedp.ID("f-mem"), "1"),
		chromedp.Click(chromedp.ID("lend-submit"), chromedp.NodeVisible))
	lend.waitText(5*time.Second, "#f-cores-error", fmt.Sprintf("this machine has %d", inv.Cores))
	if v := js[string](lend, `document.querySelector("#f-cores").getAttribute("aria-invalid")`); v != "true" {
		t.Errorf("the cores field is not marked invalid (aria-invalid=%q)", v)
	}
	if v := js[string](lend, `document.activeElement.id`); v != "f-cores" {
		t.Errorf("focus is on %q, not on the field at fault", v)
	}
	lend.shot("resources-error")
	// The node refuses it too, naming the field (what the form shows when
	// the script's own check passes).
	_, err := lender.client.SetLend(t.Context(), api.LendRequest{Cores: inv.Cores + 3, MemBytes: 1 << 30})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Field != "cores" {
		t.Errorf("lending %d cores through the API: %v, want an error on field cores", inv.Cores+3, err)
	}
	// A reserve price above the protocol's limit passes the page's checks;
	// the node's refusal names the field and shows beside it.
	lend.do("fill the lend form with a price too high",
		chromedp.SetValue(chromedp.ID("f-cores"), "1"),
		chromedp.SetValue(chromedp.ID("f-price_core"), "2000000"),
		chromedp.Click(chromedp.ID("lend-submit"), chromedp.NodeVisible))
	lend.waitText(10*time.Second, "#f-price_core-error", "at most")
	if txt := js[string](lend, textOf("#f-cores-error")); txt != "" {
		t.Errorf("the cores error stayed: %q", txt)
	}
	time.Sleep(time.Second)
	if st := lender.Lend(); st.Lending {
		t.Fatalf("a refused lend lent: %+v", st)
	}
	js[string](lend, `document.querySelector("#f-price_core").value = ""`) // back to the defaults

	// One core and 1 GiB: lent, and the submitter's Market page shows it
	// without reloading.
	lend.do("lend one core",
		chromedp.SetValue(chromedp.ID("f-cores"), "1"),
		chromedp.Click(chromedp.ID("lend-submit"), chromedp.NodeVisible))
	lend.waitText(10*time.Second, "#lend-done", "Lent")
	if st := lender.Lend(); !st.Lending || st.Settings.Cores != 1 || st.Settings.MemBytes != 1<<30 {
		t.Fatalf("after the lend form: %+v", st)
	}
	lend.waitText(10*time.Second, "#lend-status", "offering")
	ov, err := lender.client.Overview(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m := ov.Machines[0]; !m.Self || m.State != api.MachineOffering || m.PerHour == 0 || ov.Estimate.EarningsIfBusy != 24*m.PerHour {
		t.Errorf("the lender's overview: %+v", ov)
	}
	market.waitText(30*time.Second, "#offers-table", "lender")
	market.waitText(10*time.Second, "#offers-table", "lab-b")
	market.shot("market")

	// The submitter's dashboard stays open in its own tab: the balance
	// must follow the job there.
	dash := b.tab(sub, false)
	dash.open("/", "dashboard")
	before, err := sub.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	dash.wait(15*time.Second, "the balance", fmt.Sprintf(`document.querySelector("#balance")?.dataset.micro === "%d"`, before.Balance))

	// Submit a generic job through the form, the bundle uploaded.
	bundle := t.TempDir()
	script := `import os, pathlib, sys
if "fail" in sys.argv:
    print("failing on purpose", flush=True)
    sys.exit(3)
out = pathlib.Path(os.environ["DM_OUTPUT_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / "answer.txt").write_text("42 from rank %s\n" % os.environ["DM_RANK"])
print("hello from the dashboard test", flush=True)
# Training, as the deepmarket package reports it: steps of a total, the
# loss and accuracy, an evaluation every 6 steps (the page's curves).
import json, time
report = pathlib.Path(os.environ["DM_PROGRESS_FILE"])
ev = {}
for step in range(1, 19):
    time.sleep(0.4)
    rec = {"units": step, "steps": step, "total": 18, "loss": 2.0 / step, "accuracy": 0.5 + step / 40}
    if step % 6 == 0:
        ev = {"eval_loss": 2.2 / step, "eval_accuracy": 0.48 + step / 40, "eval_at": step}
    rec.update(ev)
    report.with_name("p.tmp").write_text(json.dumps(rec))
    report.with_name("p.tmp").replace(report)
    print("step %d" % step, flush=True)
print("2026-11-27 00:53:30.272382: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.", flush=True)
`
	if err := os.WriteFile(filepath.Join(bundle, "job.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	jobsTab := market
	jobsTab.nav("/jobs", "jobs")
	// A spec with a key jobs do not have is refused beside the file input;
	// a good one fills the form (its memory is wrong, on purpose).
	specs := t.TempDir()
	bad, good := filepath.Join(specs, "bad.toml"), filepath.Join(specs, "job.toml")
	os.WriteFile(bad, []byte("name = \"x\"\ncolour = \"red\"\n"), 0o644)
	os.WriteFile(good, []byte(`name = "dash-e2e"
framework = "generic"
command = ["python3", "job.py"]
workers = 1
cores = 1
memory = "lots"
max_price = "1"
max_duration = "5m"
`), 0o644)
	jobsTab.do("load a bad spec", chromedp.SetUploadFiles(chromedp.ID("spec-toml"), []string{bad}))
	jobsTab.waitText(10*time.Second, "#spec-toml-error", `unknown key "colour"`)
	jobsTab.do("load the spec", chromedp.SetUploadFiles(chromedp.ID("spec-toml"), []string{good}))
	jobsTab.wait(10*time.Second, "the form filled from the spec", `document.querySelector("#f-name").value === "dash-e2e" && document.querySelector("#f-framework").value === "generic" && document.querySelector("#f-command").value === "python3 job.py" && document.querySelector("#f-memory").value === "lots"`)
	jobsTab.do("upload the bundle", chromedp.SetUploadFiles(chromedp.ID("bundle-files"), []string{filepath.Join(bundle, "job.py")}))
	jobsTab.waitText(30*time.Second, "#bundle-upload-status", "Uploaded 1 file")
	cid := js[string](jobsTab, `document.querySelector("#f-bundle").value`)
	if !jobs.IsCID(cid) {
		t.Fatalf("the bundle field holds %q after the upload, not a CID", cid)
	}
	jobsTab.do("ask for a quote", chromedp.Click(chromedp.ID("get-quote"), chromedp.NodeVisible))
	// The node's answer names the field: shown beside it.
	jobsTab.waitText(15*time.Second, "#f-memory-error", "memory")
	jobsTab.shot("jobs-error")
	jobsTab.do("fix the memory and ask again",
		chromedp.SetValue(chromedp.ID("f-memory"), "256MiB"),
		chromedp.Click(chromedp.ID("get-quote"), chromedp.NodeVisible))
	jobsTab.wait(60*time.Second, "the quote", `document.querySelector("#quote-confirm")`)
	jobsTab.waitText(time.Second, "#quote-workers", "lender")
	for _, sel := range []string{"#quote-per-hour", "#quote-total"} {
		if txt := js[string](jobsTab, textOf(sel)); !strings.Contains(txt, "credits") {
			t.Errorf("%s says %q", sel, txt)
		}
	}
	jobsTab.waitText(time.Second, "#quote", "lab-b")
	jobsTab.shot("jobs-quote")
	jobsTab.do("confirm", chromedp.Click(chromedp.ID("quote-confirm"), chromedp.NodeVisible))
	jobsTab.wait(15*time.Second, "the job's page", `location.pathname.startsWith("/jobs/") && document.querySelector("#job-head [data-state]")`)
	id := strings.TrimPrefix(js[string](jobsTab, `location.pathname`), "/jobs/")
	jobsTab.wait(3*time.Minute, "the job to succeed", `document.querySelector('#job-head [data-state="succeeded"]')`)
	jobsTab.waitText(15*time.Second, "#job-logs", "hello from the dashboard test")
	jobsTab.waitText(10*time.Second, "#workers-table", "lender")
	j, err := sub.client.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Succeeded || j.BundleCID != cid {
		t.Fatalf("job %s: %s (%s), bundle %s, want succeeded with bundle %s", id, j.State, j.Reason, j.BundleCID, cid)
	}
	jobsTab.waitText(10*time.Second, "#result-cid", j.ResultCID)
	// Its result and curves: the last evaluation, the loss and accuracy
	// drawn per worker, against steps and then time; TensorFlow's noise
	// left out of the log until asked for.
	jobsTab.waitText(10*time.Second, "#job-accuracy", "accuracy 0.9300")
	jobsTab.waitText(time.Second, "#job-progress", "Ended")
	jobsTab.wait(5*time.Second, "the curves", `document.querySelectorAll("#job-curves svg polyline").length === 2 && document.querySelectorAll("#job-curves svg circle").length >= 6`)
	if s := j.Summary; s == nil || math.Abs(s.Accuracy-0.93) > 1e-9 || !s.Evaluated || s.Duration <= 0 || s.Ended.IsZero() {
		t.Errorf("the job's summary: %+v", s)
	}
	if !strings.Contains(js[string](jobsTab, textOf("#job-logs")), "step 18") || strings.Contains(js[string](jobsTab, textOf("#job-logs")), "oneDNN") {
		t.Errorf("the log, TensorFlow's noise left out: %q", js[string](jobsTab, textOf("#job-logs")))
	}
	jobsTab.waitText(time.Second, "#log-hidden", "1 line left out")
	jobsTab.do("show TensorFlow's messages", chromedp.Click(chromedp.ID("log-verbose"), chromedp.NodeVisible))
	jobsTab.waitText(time.Second, "#job-logs", "oneDNN")
	jobsTab.shot("job")
	jobsTab.do("draw the curves against time", chromedp.Click(chromedp.ID("curves-axis"), chromedp.NodeVisible))
	jobsTab.waitText(time.Second, "#curves-axis", "Against steps")

	// The download link gives the chief's output.
	b64 := js[string](jobsTab, `fetch(document.querySelector("#result-download").href)
		.then((r) => { if (!r.ok) throw new Error("download: " + r.status); return r.arrayBuffer(); })
		.then((buf) => { let s = ""; for (const x of new Uint8Array(buf)) s += String.fromCharCode(x); return btoa(s); })`)
	if got := untarFile(t, b64, "answer.txt"); got != "42 from rank 0\n" {
		t.Errorf("answer.txt in the downloaded result: %q", got)
	}

	// A quote can be turned down: the job is cancelled and costs nothing.
	jobsTab.nav("/jobs", "jobs")
	jobsTab.do("load the spec again", chromedp.SetUploadFiles(chromedp.ID("spec-toml"), []string{good}))
	jobsTab.wait(10*time.Second, "the form filled from the spec", `document.querySelector("#f-name").value === "dash-e2e"`)
	jobsTab.do("ask for another quote",
		chromedp.SetValue(chromedp.ID("f-name"), "dash-declined"),
		chromedp.SetValue(chromedp.ID("f-memory"), "256MiB"),
		chromedp.SetValue(chromedp.ID("f-bundle"), cid),
		chromedp.Click(chromedp.ID("get-quote"), chromedp.NodeVisible))
	jobsTab.wait(60*time.Second, "the quote", `document.querySelector("#quote-cancel")`)
	jobsTab.do("decline it", chromedp.Click(chromedp.ID("quote-cancel"), chromedp.NodeVisible))
	jobsTab.waitText(60*time.Second, "#quote-box", "cancelled before it ran")
	all, err := sub.client.Jobs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	declined := 0
	for _, dj := range all {
		if dj.Spec.Name == "dash-declined" {
			declined++
			if dj.State != jobs.Cancelled || dj.Cost != 0 {
				t.Errorf("the declined job: %s, cost %d", dj.State, dj.Cost)
			}
			for _, w := range dj.Workers {
				if w.State != jobs.WorkerReleased {
					t.Errorf("a worker of the declined job is %s, not released", w.State)
				}
			}
		}
	}
	if declined != 1 {
		t.Errorf("%d declined jobs, want 1", declined)
	}

	// The dashboard's balance followed, without a reload, once the
	// escrow's dispute window closed.
	waitRefunded(t, sub, j)
	after, err := sub.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if after.Balance >= before.Balance || before.Balance-after.Balance != j.Cost {
		t.Errorf("balance %d -> %d for a job that cost %d", before.Balance, after.Balance, j.Cost)
	}
	dash.wait(20*time.Second, "the dashboard's balance to follow the job",
		fmt.Sprintf(`document.querySelector("#balance")?.dataset.micro === "%d"`, after.Balance))
	dash.waitText(10*time.Second, "#jobs-table", "dash-e2e")
	dash.waitText(10*time.Second, "#jobs-table", "succeeded")
	dash.wait(20*time.Second, "the 30-day chart", `document.querySelector("#flows-chart svg rect.spent")`)
	if n := js[int](dash, `document.querySelectorAll("#flows-chart svg rect.spent").length`); n != 30 {
		t.Errorf("the 30-day chart has %d days", n)
	}
	// What the chart draws: the submitter spent what the job cost, the
	// lender earned it.
	if a, err := sub.client.Activity(t.Context(), "", 30); err != nil || a.Spent != j.Cost || a.Days[29].Spent != j.Cost {
		t.Errorf("the submitter's activity: %+v (%v), want %d spent today", a, err, j.Cost)
	}
	// (The lender's replica may be a block behind.)
	eventually(t, 10*time.Second, "the lender's activity to show what it earned", func() bool {
		a, err := lender.client.Activity(t.Context(), "", 30)
		return err == nil && a.Earned == j.Cost && a.Days[29].Earned == j.Cost
	})

	// A job that fails shows as a problem, in red, without a reload.
	failed, err := sub.client.Submit(t.Context(), api.SubmitRequest{Yes: true, Spec: jobs.File{Name: "dash-fails", Framework: "generic",
		Command: []string{"python3", "job.py", "fail"}, Bundle: cid, Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "1", MaxDuration: "5m"}})
	if err != nil {
		t.Fatal(err)
	}
	if f := waitJob(t, sub, failed.ID, 2*time.Minute); f.State != jobs.Failed {
		t.Fatalf("the failing job: %s (%s)", f.State, f.Reason)
	}
	dash.waitText(20*time.Second, "#problems", "dash-fails failed")
	dash.wait(5*time.Second, "the failed job's row in red", `document.querySelector("#jobs-table tr.panic")?.textContent.includes("dash-fails")`)
	dash.shot("dashboard")

	// Every other page, on the submitter.
	pages := []struct{ path, page, ready string }{
		{"/resources", "resources", `document.querySelector("#inventory-list") && document.querySelector("#owned-table")`},
		{"/jobs", "jobs", `document.querySelector("#jobs-table")?.textContent.includes("dash-e2e")`},
		{"/market", "market", `document.querySelector("#offers-table") && document.querySelector("#price-history svg polyline") && document.querySelector("#rejection-reason")?.textContent.includes("code 3")`},
		{"/ledger", "ledger", `document.querySelector("#history-table")?.textContent.includes("settled")`},
		{"/network", "network", `document.querySelector("#validators-table") && document.querySelector("#peers-table")?.textContent.includes("lender") && document.querySelector("#peers-table")?.textContent.includes("direct") && document.querySelector("#health")?.textContent === "healthy" && document.querySelector("#reachability")?.textContent.length > 0`},
	}
	for _, p := range pages {
		dash.nav(p.path, p.page)
		dash.wait(30*time.Second, p.page+" to fill in", p.ready)
		if p.page == "ledger" {
			// A transfer: a malformed account is refused beside its
			// field; a good one moves the credits.
			// Both balances as the submitter's replica has them, where the
			// transfer commits first.
			lb, err := sub.client.Balance(t.Context(), string(lender.Key().Address()))
			if err != nil {
				t.Fatal(err)
			}
			dash.do("transfer to nobody",
				chromedp.SetValue(chromedp.ID("f-to"), "dm1nobody"),
				chromedp.SetValue(chromedp.ID("f-amount"), "2.5"),
				chromedp.Click(chromedp.ID("transfer-submit"), chromedp.NodeVisible))
			dash.wait(15*time.Second, "the error beside the account", textOf("#f-to-error")+` !== ""`)
			dash.do("transfer to the lender",
				chromedp.SetValue(chromedp.ID("f-to"), lb.Address),
				chromedp.Click(chromedp.ID("transfer-submit"), chromedp.NodeVisible))
			dash.waitText(30*time.Second, "#transfer-done", "Sent 2.5 credits")
			if la, err := sub.client.Balance(t.Context(), lb.Address); err != nil || la.Balance != lb.Balance+2_500_000 {
				t.Errorf("the lender's balance after a transfer of 2.5: %d -> %d (%v)", lb.Balance, la.Balance, err)
			}
			dash.waitText(15*time.Second, "#history-table", "sent to "+lb.Address)
			dash.do("run the audit", chromedp.Click(chromedp.ID("run-audit"), chromedp.NodeVisible))
			dash.waitText(60*time.Second, "#audit-result", "The books balance")
		}
		dash.shot(p.page)
	}

	// A narrow window: one column, nothing wider than the window.
	dash.do("narrow the window", chromedp.EmulateViewport(400, 800))
	for _, p := range []struct{ path, page string }{{"/", "dashboard"}, {"/jobs/" + id, "job"}, {"/resources", "resources"}} {
		dash.open(p.path, p.page)
		time.Sleep(500 * time.Millisecond) // let the fetches land
		if w := js[int](dash, `document.documentElement.scrollWidth - window.innerWidth`); w > 1 {
			wide := js[[]string](dash, `[...document.querySelectorAll("body *")]
				.filter((el) => (el.getBoundingClientRect().right > window.innerWidth + 1 || el.scrollWidth > el.clientWidth + 1) && !el.closest(".table-wrap table"))
				.slice(0, 8).map((el) => el.tagName + "." + el.className + " " + el.scrollWidth + "/" + el.clientWidth + " " + getComputedStyle(el).overflowX + " " + (el.textContent || "").slice(0, 40))`)
			t.Errorf("%s at 400 px: the page is %d px wider than the window; too wide: %q", p.path, w, wide)
		}
	}
	dash.shot("dashboard-narrow")

	// Taking the machine back through the form.
	lend.do("take it back", chromedp.Click(chromedp.ID("stop-lend"), chromedp.NodeVisible))
	lend.do("confirm", chromedp.Click(chromedp.ID("stop-confirm"), chromedp.NodeVisible))
	lend.waitText(30*time.Second, "#lend-status", "not lending")
	if st := lender.Lend(); st.Lending {
		t.Errorf("after taking the machine back: %+v", st)
	}
}
