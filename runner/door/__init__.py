"""The front door: the one network-facing process of a host, unprivileged, reaching the root
engine only through its socket: one TLS port that speaks the Postgres protocol for every
branch of the pool (``router.FrontDoor``), and the web application (``runner/web/``).

Why a router of our own and not PgBouncer (Debian's package: TLS, per-database routing, reload
without dropping clients): PgBouncer authenticates clients itself, so it would need each branch
role's SCRAM secret or password and hold the credentials of every branch; it cannot tell an
unknown database from a wrong password, so probing would list the branches; it cannot
rate-limit failed logins per source address; it has no SNI routing; and it cannot hold a first
connection while a suspended branch starts. The router here relays the branch's own SCRAM
exchange message by message and then splices bytes, so it never sees a password.

Its cost is measured side by side with a direct connection and with PgBouncer 1.18 configured
as the door is (the same certificate to verify-full clients, SCRAM checked against the role's
verifier, session mode) by ``bench/frontdoor.py``; the figures are in docs/benchmarks.md's
front-door section. On the 2-core machine, quiet, medians of 3 rounds: per-query latency
+0.028 ms at p50 (PgBouncer +0.030; target at most 0.1 ms: met), connection set-up +2.3 ms
(target at most 5 ms: met; PgBouncer hands a pooled backend to the next login instead),
`pgbench -S -c 1` 0.81x of direct (PgBouncer 0.81x), `pgbench -S -c 4` 0.27x (PgBouncer
0.31x), and 0.44x for both with the proxy pinned to a core of its own. The 0.9x throughput
target is met by neither: each query makes one more hop each way, with TLS on the client's
side, and four clients on two cores feel it. The door's cost is the proven proxy's, and the
reasons above for a router of our own stand. uvloop carries 1.2x asyncio's own loop's
throughput, so the door runs on it. What could narrow the gap: several door processes on one
port (SO_REUSEPORT) on hosts with cores to spare, and kernel TLS with splice(2) for the
relayed bytes, which Python 3.11's ssl module cannot use.

Modules: ``startup`` (the protocol, sans I/O), ``tls`` (certificate, key, fingerprint),
``guard`` (caps, failed logins, login timings), ``channel`` (one side of a connection: read
as messages, then spliced), ``login`` (a branch's SCRAM relayed, or a wrong password
imitated), ``router`` (the server), ``inthread`` (a door on a thread's loop, for the
benchmark and tests), ``privsep`` and ``serve`` (the process: root's preparation, then its
own user). The branch pages and the network API the same process serves on its HTTPS port
are the web application's (``runner/web/``).
"""
