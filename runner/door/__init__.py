"""The front door: the one network-facing process of a host, unprivileged, reaching the root
engine only through its socket: one TLS port that speaks the Postgres protocol for every
branch of the pool (``router.FrontDoor``), and the branch pages (``page``).

Why a router of our own and not PgBouncer (Debian's package: TLS, per-database routing, reload
without dropping clients): PgBouncer authenticates clients itself, so it would need each branch
role's SCRAM secret or password and hold the credentials of every branch; it cannot tell an
unknown database from a wrong password, so probing would list the branches; it cannot
rate-limit failed logins per source address; it has no SNI routing; and it cannot hold a first
connection while a suspended branch starts. The router here relays the branch's own SCRAM
exchange message by message and then splices bytes, so it never sees a password. Its cost,
measured side by side with a direct connection and with PgBouncer 1.18 by
``bench/frontdoor.py`` (figures in docs/benchmarks.md, the front-door section; on the shared
2-core machine, at load 4.2 to 4.7 from other work, medians of 3 rounds): per-query latency
+0.018 ms at p50 through TLS on uvloop (target at most 0.1 ms: met); connection set-up +2.1 ms
(target at most 5 ms: met; 2 to 4.3 ms over runs); `pgbench -S -c 4 -j 2` 0.48x of direct
(target 0.9x: not met; 0.24 to 0.48x over runs); `pgbench -S -c 1` 0.35x (0.78x in an earlier
run on a quieter machine). PgBouncer in the same rounds, configured as the door is (the same
certificate to verify-full clients, plaintext to the branch, SCRAM checked against the role's
verifier, pool_mode=session, which a reviewer's session needs): +0.015 ms at p50, 0.50x with 4
clients (0.52x in transaction mode), 0.51x with one, set-up 1.1 ms below direct (it hands a
pooled server connection to the next login; the door starts a backend for each). So the proven
proxy does not reach 0.9x here either: with 4 clients both are bound by the same two shared
cores (the door 23 us of CPU per transaction, 40% of a core at 17,400 tps; PgBouncer 18 us, 34%
at 18,400); with one client PgBouncer's C loop carried 1.45x the door's throughput (medians;
the door's rounds spread from 11,700 to 17,400 tps). The reasons above for a router of our own
stand; the single-client gap is its price. Why 0.9x is out of reach on this machine: on two
cores shared with pgbench's clients and four backends a proxy gets about half a core, and 0.9x
of the direct 33,000 to 79,000 tps would need more than a core for the proxy alone. The direct
way is also plaintext where the door's is TLS (the door without TLS: 0.36 to 0.61x over runs).
uvloop measured faster than asyncio's own loop (1.2 to 1.25x the pgbench throughput, lower
latency), so the door runs on it. What would close the gap, in order: a machine with cores to
spare (rerun there); several door processes on one port (SO_REUSEPORT), one per core; kernel
TLS (kTLS) with splice(2) for the relayed bytes, which Python 3.11's ssl module cannot use.

Modules: ``startup`` (the protocol, sans I/O), ``tls`` (certificate, key, fingerprint),
``guard`` (caps, failed logins, login timings), ``channel`` (one side of a connection: read
as messages, then spliced), ``login`` (a branch's SCRAM relayed, or a wrong password
imitated), ``router`` (the server), ``inthread`` (a door on a thread's loop, for the
benchmark and tests), ``privsep`` and ``serve`` (the process: root's preparation, then its
own user), ``page``, ``oauth``, ``sessions`` and ``render`` (the branch pages), ``oidc``
(a GitHub Actions OIDC token verified) and ``policy`` (who may use the pool).
"""
