"""The front door: the one network-facing process of a host, unprivileged, reaching the root
engine only through its socket: one TLS port that speaks the Postgres protocol for every
branch of the pool (``router.FrontDoor``), and the branch pages (``page``).

Why a router of our own and not PgBouncer (Debian's package: TLS, per-database routing,
reload without dropping clients): PgBouncer authenticates clients itself, so it would need
each branch role's SCRAM secret or password and hold the credentials of every branch; it
cannot tell an unknown database from a wrong password, so probing would list the branches;
it cannot rate-limit failed logins per source address; it has no SNI routing; and it cannot
hold a first connection while a suspended branch starts. The router here relays the branch's
own SCRAM exchange message by message and then splices bytes, so it never sees a password.
Its cost, measured side by side with a direct connection by ``bench/frontdoor.py`` (figures
in docs/benchmarks.md, the front-door section; first run on the shared 2-core machine, loaded
by other work, medians of 3 rounds): per-query latency +0.02 ms at p50 through TLS on uvloop
(target at most 0.1 ms: met); connection set-up +4.3 ms (target at most 5 ms: met, 2 to 4 ms
in other runs); `pgbench -S -c 4 -j 2` 0.40x of direct (target 0.9x: not met; 0.24 to 0.40x
over runs). Why: the door spends about 24 us of CPU per pgbench transaction with TLS (44% of
a core at 18,600 tps; 21 us without TLS), in one process, and on two cores shared with
pgbench's clients and four backends it gets about half a core; 0.9x of the direct 47,000 to
79,000 tps would need more than a core for the door alone. With one client (`-c 1`, where the
door is not short of CPU) it is 0.78x of direct, simple or prepared protocol alike. The
direct way is also plaintext where the door's is TLS (the door without TLS: 0.36 to 0.56x).
uvloop measured faster than asyncio's own loop (about 1.25x the pgbench throughput, lower
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
