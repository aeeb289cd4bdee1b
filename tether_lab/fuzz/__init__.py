"""`tether fuzz`: generated and mutated inputs against every surface of a running Tether.

    tether fuzz --iterations 10000 --seed 1             # starts its own `tether serve` subprocess
    tether fuzz --iterations 2000 --target 127.0.0.1:8000,127.0.0.1:50051 --api-key KEY

Surfaces (each gets `--iterations` inputs):

- `ws`: WebSocket text (and a few binary) frames on long-lived connections to `/v1/responses`;
- `http`: HTTP requests: create bodies (JSON and SSE), input_tokens, compact, retrieve, delete,
  input_items (mutated ids and query strings), unknown paths and methods, bad auth headers;
- `grpc`: the `Session` stream fed semantically mutated `SessionRequest` protos (60%); raw
  mutated/random bytes on a fresh `Session` stream through a generic stub with identity
  serializers (25%); raw bytes to the unary RPCs (15%).

Inputs are seeded from valid traffic: at start the fuzzer runs a real rollout (a tool loop:
create with tools -> function_call -> function_call_output with `previous_response_id` -> text;
store=true and store=false; lanes; steer, append, cancel, processed) and records what it sent.
Mutations: JSON-level (drop/add/retype keys, boundary values, type swaps, duplication, deep
nesting, cross-over between seeds, real and foreign ids), text-level (truncate, splice, insert
brackets/escapes/control characters), proto-level (every field kind, oneof switches, unknown
fields) and raw-byte level; plus inputs generated from scratch.

Checks, per input: an answer within the deadline (`--deadline-s`; a WS frame or gRPC message is
followed by a sentinel `response.cancel` for an unknown id, whose `response_not_found` error
marks "everything before me was processed"; a create must then be answered by an `error` or a
`response.created`, and a created response must reach its terminal event); every reply well
formed (strict parse with the official SDK's pydantic types, the JSON error shapes, and the
event-sequence rules: created first, contiguous sequence numbers, exactly one terminal event);
no 5xx / `server_error`; the server process alive. After the campaign: the server still healthy
(a normal rollout over WebSocket, HTTP and gRPC succeeds), its RSS growth after warmup within
`--rss-growth-mib`, and no error lines in its log (own server only).

Findings are classes of outcomes that must not happen (`hang`, `malformed`, `http_5xx`,
`server_error`, `closed`, `crash`, ...); `deviation:*` classes are known, documented protocol
deviations counted separately. Exit status 0 when there are no findings.

Modules: `mutation` (seeds and mutators), `oracle` (the SDK types, the stream rules, the outcome
classes), `surfaces` (WebSocket, HTTP, gRPC), `campaign` (the run, the report, `main`).
"""
