"""The front door: one TLS port that speaks the Postgres protocol for every branch of the pool
(``router.FrontDoor``), run unprivileged in a process of its own.

Why a router of our own and not PgBouncer (Debian's package: TLS, per-database routing,
reload without dropping clients): PgBouncer authenticates clients itself, so it would need
each branch role's SCRAM secret or password and hold the credentials of every branch; it
cannot tell an unknown database from a wrong password, so probing would list the branches;
it cannot rate-limit failed logins per source address; it has no SNI routing; and it cannot
hold a first connection while a suspended branch starts. The router here relays the branch's
own SCRAM exchange message by message and then splices bytes, so it never sees a password.
Its cost, measured side by side with a direct connection by ``bench/frontdoor.py``, is in
docs/benchmarks.md (the front-door section).

Modules: ``startup`` (the protocol, sans I/O), ``tls`` (certificate, key, fingerprint),
``guard`` (caps, failed logins, login timings), ``channel`` (one side of a connection: read
as messages, then spliced), ``router`` (the server), ``inthread`` (a door on a thread's loop,
for the benchmark and tests).
"""
