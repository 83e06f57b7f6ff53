"""Stable codes of the central reconciler: commands, the service, the store, the loop, providers.

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# a query parameter out of range or vocabulary
API_BAD_REQUEST = "api.bad_request"
# 503
API_CAPACITY_COMPUTING = "api.capacity_computing"
# PostgreSQL cannot be reached
API_DB_UNAVAILABLE = "api.db_unavailable"
# a tenant token on an operator-only path
API_FORBIDDEN = "api.forbidden"
# a bug: see the server log
API_INTERNAL = "api.internal"
# everything is GET (and HEAD)
API_METHOD_NOT_ALLOWED = "api.method_not_allowed"
# the database was never migrated (nothing reconciled yet)
API_NO_SCHEMA = "api.no_schema"
# an allocation or node id the store does not know
API_NOT_FOUND = "api.not_found"
# no such path
API_ROUTE_NOT_FOUND = "api.route_not_found"
# an error code, not a secret; a bearer token that is not the configured one
API_TOKEN_INVALID = "api.token_invalid"
# no bearer token where one is required
API_UNAUTHORIZED = "api.unauthorized"
# cannot read the history of …: …
APPLY_GIT = "apply.git"
# … validation error(s): nothing applied
APPLY_INVALID = "apply.invalid"
# …: the planned head was invalid; nothing to apply
APPLY_PLAN_INVALID = "apply.plan_invalid"
# …: an --offline plan was computed without the database and cannot be applied; plan against the database to...
APPLY_PLAN_OFFLINE = "apply.plan_offline"
# the planned head … has … validation error(s) now
APPLY_PLAN_STALE = "apply.plan_stale"
# …: field … is missing or malformed; not a plan file gpuaas wrote
APPLY_PLAN_UNREADABLE = "apply.plan_unreadable"
# …: plan file version …; this gpuaas applies version … only: plan again
APPLY_PLAN_VERSION = "apply.plan_version"
# apply refused a revision that does not descend from the applied one (--allow-rewind applies it)
APPLY_REWIND = "apply.rewind"
# … desired-state file(s) under … differ from HEAD: …; apply reads the committed tree, so commit them (or pas...
APPLY_TREE_DIRTY = "apply.tree_dirty"
# --repo goes with a plan file; give the repo itself as PATH
APPLY_USAGE = "apply.usage"
# the machine provider failed to deploy the node
BAREMETAL_DEPLOY_FAILED = "baremetal.deploy.failed"
# allocation … has no baremetal image to deploy
BAREMETAL_DEPLOY_NO_IMAGE = "baremetal.deploy.no_image"
# the machine provider failed to erase the node
BAREMETAL_ERASE_FAILED = "baremetal.erase.failed"
# the provider's machine is busy with another operation
BAREMETAL_MACHINE_BUSY = "baremetal.machine.busy"
# the machine provider does not know the node's machine
BAREMETAL_MACHINE_MISSING = "baremetal.machine.missing"
# a MAAS API key has three parts, consumer_key:token_key:token_secret
BAREMETAL_PROVIDER_CREDENTIALS = "baremetal.provider.credentials"
# the machine provider refused a request
BAREMETAL_PROVIDER_REFUSED = "baremetal.provider.refused"
# machine provider … is not declared in Fleet.machine_providers
BAREMETAL_PROVIDER_UNDECLARED = "baremetal.provider.undeclared"
# the machine provider cannot be reached
BAREMETAL_PROVIDER_UNREACHABLE = "baremetal.provider.unreachable"
# the deployed node does not answer SSH yet
BAREMETAL_SSH_WAITING = "baremetal.ssh.waiting"
# the reconciler did not apply the base revision: …
BENCH_GITOPS_START = "bench.gitops.start"
# no claim for … after …s
BENCH_GITOPS_TIMEOUT = "bench.gitops.timeout"
# Ironic is not installed: `make deps` puts it in .venv/ironic
BENCH_IRONIC_MISSING = "bench.ironic_missing"
# --agents … needs … open files; the hard limit is …
BENCH_NOFILE = "bench.nofile"
# a plan from the kept base printed other than --no-cache
BENCH_OUTPUT_DIFFERS = "bench.output_differs"
# pgbench failed
BENCH_PGBENCH = "bench.pgbench"
# gpuaas plan failed (…): …
BENCH_PLAN_FAILED = "bench.plan_failed"
# the portal bench's request was refused
BENCH_PORTAL_INTAKE = "bench.portal.intake"
# applying the example fleet failed
BENCH_PORTAL_SETUP = "bench.portal.setup"
# --requests and --interval must be positive
BENCH_PORTAL_USAGE = "bench.portal.usage"
# a request of the service bench failed
BENCH_SERVE_REQUEST_FAILED = "bench.serve.request_failed"
# serve did not start: …
BENCH_SERVE_FAILED = "bench.serve_failed"
# sample … never reached the API
BENCH_TELEMETRY_LOST = "bench.telemetry.lost"
# the listener answered … to sample …
BENCH_TELEMETRY_POST_REFUSED = "bench.telemetry.post_refused"
# placed … of … allocations
BENCH_TELEMETRY_SETUP_FAILED = "bench.telemetry.setup_failed"
# --samples must be positive, --vms 1-8, --report-interval and --poll-ms above 0
BENCH_TELEMETRY_USAGE = "bench.telemetry.usage"
# leases did not settle within … s
BENCH_TIMEOUT = "bench.timeout"
# --agents and --duration must be positive
BENCH_USAGE = "bench.usage"
# every candidate the planner gave was refused by the database
CLAIM_CANDIDATES_REFUSED = "claim.candidates_refused"
# every candidate was lost to concurrent placements (placement.max_claim_attempts tried)
CLAIM_CONFLICT_EXHAUSTED = "claim.conflict_exhausted"
# the console did not take input for 10 s
CONSOLE_STALLED = "console.stalled"
# the VM's console cannot be opened
CONSOLE_UNAVAILABLE = "console.unavailable"
# apply needs an autocommit connection (one transaction per placement)
DB_APPLY_AUTOCOMMIT = "db.apply.autocommit"
# gpuaas_place returned nothing
DB_APPLY_NO_RESULT = "db.apply.no_result"
# the embedded PostgreSQL failed
DB_EMBEDDED = "db.embedded"
# a command of the embedded PostgreSQL failed
DB_EMBEDDED_COMMAND = "db.embedded.command"
# cannot create database …: …
DB_EMBEDDED_CREATEDB = "db.embedded.createdb"
# initdb of the embedded PostgreSQL failed
DB_EMBEDDED_INITDB = "db.embedded.initdb"
# running as root needs a … user to own the server
DB_EMBEDDED_NO_OWNER = "db.embedded.no_owner"
# no PostgreSQL server binaries found (apt-get install postgresql, or set GPUAAS_PG_BIN, or set GPUAAS_DATABA...
DB_EMBEDDED_NO_POSTGRES = "db.embedded.no_postgres"
# server did not start: …; see …
DB_EMBEDDED_START = "db.embedded.start"
# … is not searchable by other users, so the … user cannot reach …; choose another --state-dir or chmod o+x …
DB_EMBEDDED_STATE_DIR_UNREACHABLE = "db.embedded.state_dir_unreachable"
# server did not stop: …
DB_EMBEDDED_STOP = "db.embedded.stop"
# the stored inventory does not read back as desired state: …
DB_INVENTORY_UNREADABLE = "db.inventory.unreadable"
# migration …_….sql changed after it was applied; add a new migration instead of editing an applied one
DB_MIGRATION_CHANGED = "db.migration.changed"
# two migrations share version(s) …
DB_MIGRATION_DUPLICATE = "db.migration.duplicate"
# a read-only command found no embedded server: it never starts one
DB_NOT_RUNNING = "db.not_running"
# … validation error(s) in …
DEMO_INVALID = "demo.invalid"
# no VMs planned on …
DEMO_NO_PLAN = "demo.no_plan"
# …: no such directory
DESIRED_PATH_MISSING = "desired.path.missing"
# gpuaas explain: no such field
EXPLAIN_UNKNOWN_FIELD = "explain.unknown_field"
# gpuaas explain: no such kind
EXPLAIN_UNKNOWN_KIND = "explain.unknown_kind"
# gpuaas get: no such object in the database
GET_NOT_FOUND = "get.not_found"
# fetching the desired-state repo failed
GITOPS_FETCH = "gitops.fetch"
# HEAD is an ancestor of the applied revision: refused
GITOPS_HEAD_BEHIND = "gitops.head_behind"
# the database lost its schema: migrated, or the loop stops
GITOPS_NO_SCHEMA = "gitops.no_schema"
# … is not inside a git repository; the loop reconciles commits
GITOPS_NOT_A_REPO = "gitops.not_a_repo"
# the store was behind the applied revision: applied again
GITOPS_RECONVERGED = "gitops.reconverged"
# no remote named … in …; add it with `git remote add`
GITOPS_REMOTE_UNKNOWN = "gitops.remote_unknown"
# an unexpected exception in a reconcile pass (a bug; see the log)
GPUAAS_BUG = "gpuaas.bug"
# no allocation … in the database
HISTORY_UNKNOWN_ALLOCATION = "history.unknown_allocation"
# invalid host error report: …
HOST_REPORT_INVALID = "host.report.invalid"
# the node's host agent is silent past the liveness TTL
HOST_SILENT = "host.silent"
# node … has a token already: `gpuaas host token rotate …` replaces it
HOST_TOKEN_EXISTS = "host.token.exists"
# no node … in the store
HOST_TOKEN_NO_NODE = "host.token.no_node"
# --out … exists: the token is written only to a new file
HOST_TOKEN_OUT_EXISTS = "host.token.out_exists"
# cannot create --out …: …
HOST_TOKEN_OUT_UNWRITABLE = "host.token.out_unwritable"
# the node's host agent reports the node unhealthy
HOST_UNHEALTHY = "host.unhealthy"
# DELETE of an allocation whose file already says released
INTAKE_ALREADY_RELEASED = "intake.already_released"
# not JSON, or a field of the wrong type
INTAKE_BAD_REQUEST = "intake.bad_request"
# the idempotency / audit store cannot be reached: nothing was written
INTAKE_DB_UNAVAILABLE = "intake.db_unavailable"
# an allocation with this id is already in the repo
INTAKE_EXISTS = "intake.exists"
# commit or push failed after retries (nothing was left behind)
INTAKE_GIT_FAILED = "intake.git_failed"
# the same Idempotency-Key with another body
INTAKE_IDEMPOTENCY_KEY_REUSED = "intake.idempotency_key_reused"
# a tenant token asking for another tenant
INTAKE_TENANT_MISMATCH = "intake.tenant_mismatch"
# machine of node … is not quarantined
MACHINE_NOT_QUARANTINED = "machine.not_quarantined"
# …: cannot write the plan file: …
PLAN_OUT_UNWRITABLE = "plan.out_unwritable"
# unknown placement policy …
PLAN_POLICY_UNKNOWN = "plan.policy_unknown"
# not ready: the database cannot be reached
READY_DB_UNREACHABLE = "ready.db_unreachable"
# not ready: the head of the repo is not applied yet
READY_HEAD_UNAPPLIED = "ready.head_unapplied"
# no reconciliation has succeeded yet
READY_NEVER_RECONCILED = "ready.never_reconciled"
# the database has no schema yet
READY_NO_SCHEMA = "ready.no_schema"
# not ready: the last reconciliation failed
READY_RECONCILIATION_FAILING = "ready.reconciliation_failing"
# the newest successful reconciliation finished …s ago (over --max-reconcile-age …s)
READY_RECONCILIATION_STALE = "ready.reconciliation_stale"
# the request's file exists already
REQUEST_EXISTS = "request.exists"
# the request's file cannot be written
REQUEST_FILE = "request.file"
# the request's path is not a regular file
REQUEST_FILE_NOT_REGULAR = "request.file.not_regular"
# a git operation of the request failed
REQUEST_GIT = "request.git"
# allocation id … is not 3-63 lowercase letters, digits or '-'
REQUEST_ID = "request.id"
# The request would make the repo invalid; nothing was written.
REQUEST_INVALID = "request.invalid"
# no Allocation … in …
REQUEST_NOT_FOUND = "request.not_found"
# push to …/… was rejected
REQUEST_PUSH_REJECTED = "request.push_rejected"
# the request's repo cannot be read
REQUEST_REPO = "request.repo"
# the request's --ssh-key file cannot be read
REQUEST_SSH_KEY = "request.ssh_key"
# --ssh-key …: …line(s) … are not OpenSSH public keys (their content is not shown); give the .pub file
REQUEST_SSH_KEY_NOT_PUBLIC = "request.ssh_key.not_public"
# the console credentials file is invalid
SERVE_CONSOLE_CREDENTIALS_INVALID = "serve.console_credentials_invalid"
# … is accessible by group or others (mode …); chmod 600 …
SERVE_CONSOLE_CREDENTIALS_PERMISSIONS = "serve.console_credentials_permissions"
# the service failed to answer
SERVE_ERROR = "serve.error"
# the request's Host header is not an allowed host
SERVE_HOST_NOT_ALLOWED = "serve.host_not_allowed"
# --intake-push takes REMOTE/BRANCH (e.g. origin/main), not …
SERVE_INTAKE_PUSH_INVALID = "serve.intake_push_invalid"
# cannot listen on …:…: …
SERVE_LISTEN_FAILED = "serve.listen_failed"
# --listen port must be 0..65535, not …
SERVE_LISTEN_INVALID = "serve.listen_invalid"
# listening on … (not loopback) needs --token-file: every request but /healthz must then carry that bearer token
SERVE_LISTEN_NEEDS_TOKEN = "serve.listen_needs_token"
# the request took longer than the service's time limit
SERVE_REQUEST_TIMEOUT = "serve.request_timeout"
# the server did not start (see the log)
SERVE_START_FAILED = "serve.start_failed"
# the tenant tokens file is invalid
SERVE_TENANT_TOKENS_INVALID = "serve.tenant_tokens_invalid"
# token file … must hold one token (no spaces), and not be empty
SERVE_TOKEN_FILE_INVALID = "serve.token_file_invalid"
# token file … is accessible by group or others (mode …); chmod 600 …
SERVE_TOKEN_FILE_PERMISSIONS = "serve.token_file_permissions"
# cannot read token file …: …
SERVE_TOKEN_FILE_UNREADABLE = "serve.token_file_unreadable"
# the service holds too many connections
SERVE_TOO_MANY_CONNECTIONS = "serve.too_many_connections"
# webhook secret … is shorter than 16 bytes
SERVE_WEBHOOK_SECRET_INVALID = "serve.webhook_secret_invalid"
# --webhook needs --webhook-secret-file (payloads are signed)
SERVE_WEBHOOK_SECRET_MISSING = "serve.webhook_secret_missing"
# webhook secret … is accessible by group or others; chmod 600 …
SERVE_WEBHOOK_SECRET_PERMISSIONS = "serve.webhook_secret_permissions"
# cannot read webhook secret …: …
SERVE_WEBHOOK_SECRET_UNREADABLE = "serve.webhook_secret_unreadable"
# --fleet and --workload are required (or --suite)
SIMULATE_ARGS_MISSING = "simulate.args.missing"
# … does not validate (… errors); run gpuaas validate
SIMULATE_FLEET_INVALID = "simulate.fleet.invalid"
# --reserve-whole-host …: expected WINDOW_S:CAP[:AFTER] or pending:CAP[:AFTER] (pending needs --wait-s);
# --whole-host-reserve …: expected MAX_HOSTS[:AFTER_PENDING] (needs --wait-s; not with --reserve-whole-host)
SIMULATE_RESERVE = "simulate.reserve"
# --families: unknown … (known: …)
SIMULATE_SUITE_FAMILY = "simulate.suite.family"
# --wait-s …: expected a number of seconds >= 0, such as 3600
SIMULATE_WAIT = "simulate.wait"
# --loads …: loads must be in (0, 10]
SIMULATE_SUITE_LOADS = "simulate.suite.loads"
# --seeds, --requests and --nodes must be at least 1
SIMULATE_SUITE_SIZE = "simulate.suite.size"
# the workload file has no requests
SIMULATE_WORKLOAD_EMPTY = "simulate.workload.empty"
# the workload file lacks a column
SIMULATE_WORKLOAD_HEADER = "simulate.workload.header"
# a row of the workload file is invalid
SIMULATE_WORKLOAD_ROW = "simulate.workload.row"
# the workload file cannot be read
SIMULATE_WORKLOAD_UNREADABLE = "simulate.workload.unreadable"
# slot must be >= 0 and --reason at most 500 characters
SLOT_REWIPE_INVALID = "slot.rewipe.invalid"
# no slot … on node …
SLOT_UNKNOWN = "slot.unknown"
# the database has no schema yet: nothing was reconciled (run `gpuaas run`)
STATUS_NO_SCHEMA = "status.no_schema"
# gpuaas status: no such placement policy
STATUS_POLICY_UNKNOWN = "status.policy_unknown"
# tenant … is not 1-63 lowercase letters, digits or '-'
TENANT_NAME_INVALID = "tenant.name_invalid"
# …: … is not a date (YYYY-MM-DD) or an ISO 8601 time
USAGE_BAD_TIME = "usage.bad_time"
# the window is empty: --to … is not after --from …
USAGE_EMPTY_WINDOW = "usage.empty_window"
# `gpuaas …` comes with the tools, which are not installed: pip install '…' (from a checkout: pip install -e...
CLI_TOOLS_MISSING = "cli.tools_missing"
# … changed after migration … applied it; add a migration that re-applies it (a line `\ir …`), or the databas...
DB_MIGRATION_FUNCTION_CHANGED = "db.migration.function_changed"
# …:…: a line that starts with a backslash must be `\ir functions/<name>.sql`, not …
DB_MIGRATION_INCLUDE = "db.migration.include"
