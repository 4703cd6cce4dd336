# DeepMarket. `make help` lists the targets.

GO        ?= go
BIN       := bin/deepmarket
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/deepmarket/deepmarket/node.Version=$(VERSION)
HOME_DIR  ?= $(or $(DEEPMARKET_HOME),$(HOME)/.deepmarket)
# The fuzzers run a number of inputs, not a time: a time limit races Go's
# fuzz coordinator (golang/go#75804, fixed in Go 1.27) and fails the run
# with "context deadline exceeded" though nothing was found (it did, in
# FuzzValidate). FUZZTIME is the larger count, for the fast targets.
FUZZTIME  ?= 60000x
FUZZEXECS ?= 20000x
# Extra flags for `make bench-training`, e.g. TRAINING_FLAGS="-profiles lan -target 0.8"
# (go run ./bench/training -h lists them).
TRAINING_FLAGS ?=
# The Python environment jobs run with (tensorflow-cpu). As root it lives
# outside the checkout, where the unprivileged job user can reach it.
VENV      ?= $(if $(filter 0,$(shell id -u)),/opt/deepmarket/venv,$(CURDIR)/.venv)
# Where `make install` puts the binary: /usr/local as root, ~/.local otherwise.
PREFIX    ?= $(if $(filter 0,$(shell id -u)),/usr/local,$(HOME)/.local)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST) \
	  | sed -e 's|$$(HOME_DIR)|$(HOME_DIR)|g' -e 's|$$(VENV)|$(VENV)|g' -e 's|$$(PREFIX)|$(PREFIX)|g'

.PHONY: build
build: ## Build bin/deepmarket
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/deepmarket

.PHONY: run
run: build ## Build and run a node on this machine (inits $(HOME_DIR) on first use)
	@test -f "$(HOME_DIR)/config.toml" || ./$(BIN) init --home "$(HOME_DIR)"
	@command -v deepmarket >/dev/null 2>&1 || echo "The CLI is $(CURDIR)/$(BIN): put it on your PATH with 'make install' (or: export PATH=\"$(CURDIR)/bin:\$$PATH\")."
	./$(BIN) node run --home "$(HOME_DIR)"

.PHONY: install
install: build ## Install the deepmarket binary into $(PREFIX)/bin
	install -d "$(PREFIX)/bin"
	install -m 0755 $(BIN) "$(PREFIX)/bin/deepmarket"
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) ;; *) echo "note: $(PREFIX)/bin is not on your PATH";; esac

.PHONY: deps
deps: ## Install what the tests need: Go modules, the job sandbox (bubblewrap), nftables (emulated NATs), Fashion-MNIST, a tensorflow-cpu virtualenv ($(VENV)), chromium, a PyTorch base image (Debian's python3-torch)
	$(GO) mod download
	scripts/sandbox-env.sh
	scripts/netlab-env.sh
	scripts/torch-image.sh --install
	$(MAKE) --no-print-directory build
	@# The PyTorch image builds beside the virtualenv and chromium (mostly downloads).
	@scripts/torch-image.sh $(BIN) > /tmp/torch-image.out 2>&1 & pid=$$!; \
	  DM_VENV=$(VENV) scripts/python-env.sh && scripts/browser-env.sh; rc=$$?; \
	  wait $$pid || rc=1; cat /tmp/torch-image.out; exit $$rc

.PHONY: test
test: deps lint ## Install what the tests need and run every test: Go, Python beside it, fuzzers (about 16 minutes on 2 cores, as root)
	GO=$(GO) VENV=$(VENV) FUZZEXECS=$(FUZZEXECS) FUZZTIME=$(FUZZTIME) scripts/test.sh

.PHONY: lint
lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# bench-training, testnet-report and bench-scale are left out: they need root and take
# about 60, 20 and 25 minutes; bench-gpu too: it needs root and an NVIDIA GPU.
.PHONY: bench
bench: bench-p2p bench-gossip bench-ledger bench-storage bench-scheduler bench-jobs bench-tunnel bench-nat bench-queue bench-env ## Run every benchmark

.PHONY: bench-p2p
bench-p2p: build ## Gossip: propagation over 50 nodes, validation rate, idle node cost
	$(GO) run ./bench/p2p -bin $(BIN) -out bench/results/p2p.json

.PHONY: bench-gossip
bench-gossip: ## Offer gossip per node (bytes, CPU, validations a minute) in 50-300 in-process nodes at the node's pace, extrapolated to 10,000 machines beside a fixed 30 s interval; how soon a newcomer sees the market, gossip alone vs copying books (~8 min); report in bench/results/gossip
	$(GO) run ./bench/gossip -out bench/results/gossip

.PHONY: bench-ledger
bench-ledger: ## Ledger vs CometBFT's kvstore: tx/s and commit latency (1 and 4 validators), audit replay rate, per-block time at 10k/100k/1M accounts
	$(GO) run ./bench/ledger -out bench/results/ledger.json

.PHONY: bench-storage
bench-storage: ## Datasets: import vs sha256sum, 1 GiB transfer vs raw libp2p stream and TCP, 3 providers, peak RSS
	$(GO) run ./bench/storage -out bench/results/storage.json

.PHONY: bench-scheduler
bench-scheduler: ## Scheduler: placements/s and p99 over 100 to 100,000 machines, exhaustive vs indexed; slowdown vs the baselines in the simulator
	$(GO) run ./bench/scheduler -out bench/results/scheduler.json

.PHONY: bench-jobs
bench-jobs: ## Jobs (root): launch latency with 2/4/8 workers; first step and examples/s vs hand-started TF workers; epoch time with 1-3 workers
	$(GO) run ./bench/jobs -python $(VENV)/bin/python3 -out bench/results/jobs.json

.PHONY: bench-queue
bench-queue: deps ## Root: 200 one-core jobs of 30 s at once over 20 one-core machines, with the queue and without, side by side: jobs succeeded, makespan vs the ideal (~12 min)
	DM_PYTHON=$(VENV)/bin/python3 DM_REQUIRE_TF=1 DM_REQUIRE_ROOT=1 DM_BENCH_OUT=$(CURDIR)/bench/results/queue.json \
		$(GO) test -run '^$$' -bench '^BenchmarkQueue$$' -benchtime 1x -timeout 60m ./node

.PHONY: bench-tunnel
bench-tunnel: ## Tunnel: a job's TF traffic over libp2p streams vs direct loopback TCP; sandbox overhead on a CPU-bound worker
	$(GO) run ./bench/tunnel -out bench/results/tunnel.json
	$(GO) test -run '^$$' -bench CPUBound -benchtime 5x ./node/sandbox

.PHONY: bench-nat
bench-nat: ## Root: hole punching through cone and symmetric NATs in netlab with 1, 2 and 4 public nodes, TCP and QUIC (success, p50/p90 time to direct, bytes relayed; a settled node, libp2p stock vs ours), tunnel throughput over the hole punch vs no NAT (~10 min); report in bench/results/nat
	$(GO) run ./bench/nat -out bench/results/nat

.PHONY: bench-nat-machines
bench-nat-machines: ## Root: bench-nat's tunnel throughput through both NATs vs no NAT with every host in an emulated 0.6-core machine of its own (cgroups), the NAT routers outside them, 7 turns (~4 min); report in bench/results/nat-machines
	$(GO) run ./bench/nat -profiles nat -public 1 -attempts 2 -tcp-attempts 1 -reps 7 -machine-cores 0.6 -out bench/results/nat-machines

.PHONY: sim
sim: build ## Simulator: every policy on the shipped scenarios (20 seeds per load); tables and plots in bench/results/sim
	./$(BIN) sim --seeds 20 --out bench/results/sim

.PHONY: demo
demo: deps build ## The five-minute tour (root): a 3-site testnet, two nodes lend, one trains Fashion-MNIST; credits move, audits pass
	DM_BIN=$(BIN) DM_PYTHON=$(VENV)/bin/python3 scripts/demo.sh

.PHONY: test-faults
test-faults: deps ## The testnet fault and load suite at full size (1,000 bids, ...): kills, lost quorum, partition, flood
	DM_FAULTS_FULL=1 DM_PYTHON=$(VENV)/bin/python3 $(GO) test -count=1 -timeout 60m -v -run 'Fault' ./testnet/

.PHONY: testnet-report
testnet-report: deps build ## Root: one training job with 1, 2, 3 workers under lan, wifi and multi-dc; table and chart in bench/results/testnet
	$(GO) run ./bench/testnet -bin $(BIN) -python $(VENV)/bin/python3 -out bench/results/testnet

.PHONY: bench-training
bench-training: deps build ## Root: time to 0.90 on 1, 2 and 3 emulated machines of 0.5 core, sync vs DiLoCo, lan, wifi and multi-dc, predicted beside measured, against by hand (~60 min); table and chart in bench/results/training
	$(GO) run ./bench/training -bin $(BIN) -python $(VENV)/bin/python3 -out bench/results/training $(TRAINING_FLAGS)

.PHONY: bench-scale
bench-scale: deps build ## Root: 100 real node processes, each in a network namespace of its own (lan), with 4 then 7 validators: start, offer propagation p50/p99, idle CPU and RSS per node, block time, a newcomer's book and ledger copy, ledger tx/s through every node (~25 min); report in bench/results/scale.json
	$(GO) run ./bench/scale -bin $(BIN) -out bench/results/scale.json

.PHONY: bench-start
bench-start: deps build ## Root: submission to all workers running, p50/p99 over 40 two-worker jobs on a lan testnet of real node processes (1 validator, 3 lenders, a submitter; goal p50 <= 1 s, p99 <= 2 s), and a transfer's commit, the escrow's share (~4 min); report in bench/results/start.json
	$(GO) run ./bench/start -bin $(BIN) -out bench/results/start.json

.PHONY: bench-gpu
bench-held: deps ## Held DiLoCo: the holder's checks' share of a round (goal <= 5%), its CPU with 3 workers (goal <= 1 core), one poisoning worker of 3 against all honest (goal within 0.5 points) and its share of the pay, checks on and off; spot checks' replay time and a shirker's pay with them on and off (~8 min); report in bench/results/held
	$(VENV)/bin/python3 bench/held/bench_held.py $(HELD_FLAGS)

.PHONY: bench-held

bench-env: deps ## Root: a job's own image and its start: submission to its worker running without an image, in an image of 64 MiB the lender does not hold (cold) and holds (warm; goal: within 0.2 s of none), the image's unpack against tar -x of its layer (goal <= 1.5x), its cold fetch against another node's plain data get of it (goal >= 0.8x the rate), and the TensorFlow example's examples/s in an image of the lender's virtualenv against in the virtualenv (goal: within 3%); in-process nodes (~5 min); report in bench/results/env.json
	DM_PYTHON=$(VENV)/bin/python3 DM_REQUIRE_TF=1 DM_REQUIRE_ROOT=1 DM_BENCH_OUT=$(CURDIR)/bench/results/env.json \
		$(GO) test -run '^$$' -bench '^BenchmarkEnv$$' -benchtime 1x -timeout 30m ./node

.PHONY: bench-env

bench-insider: deps ## Root: an honest 2-worker job beside an insider (1-micro-credit bids, funded bids re-holding every core, 20 linked fake machines) and beside none: succeeded, launch delay (goal <= 10 s more); 10 failed marks' effect on a lender's price; in-process nodes (~5 min); report in bench/results/insider.json
	DM_PYTHON=$(VENV)/bin/python3 DM_REQUIRE_TF=1 DM_REQUIRE_ROOT=1 DM_BENCH_OUT=$(CURDIR)/bench/results/insider.json \
		$(GO) test -run '^$$' -bench '^BenchmarkInsider$$' -benchtime 1x -timeout 30m ./node

.PHONY: bench-insider

bench-fair: deps ## Fair to both sides: an honest worker's pay under each greedy-submitter strategy (goal >= the floor; its receipt after an early settlement), a lazy or caught machine's pay, a lender's exposure to a payer that stops signing, the pay after an appeal the referees overturn (goal >= 0.95), when a settled escrow closes (node pay code on a real in-memory ledger, training simulated); then what the referees' program costs beside one worker round (goal <= 1, real TensorFlow); reports in bench/results/fair.json and referee.json
	$(GO) run ./bench/fair -out bench/results/fair.json
	$(VENV)/bin/python3 -m deepmarket.bench_referee --out bench/results/referee.json

.PHONY: bench-fair

bench-gpu: deps build ## Root, a GPU: Fashion-MNIST (cnn-wide, fixed steps) by hand on the GPU, on a CPU worker and as a 1-GPU market job on a loopback testnet, and a 1-GPU job in an image without a driver; examples/s, market/by hand (goal 0.95x), GPU/CPU (5 min at most); report in bench/results/gpu (GPU_FLAGS="-framework torch -python PY" for PyTorch)
	$(GO) run ./bench/gpu -bin $(BIN) -python $(VENV)/bin/python3 -out bench/results/gpu $(GPU_FLAGS)

.PHONY: clean
clean: ## Remove build outputs
	rm -rf bin
