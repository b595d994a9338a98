"""`pgoverlay doctor` on the network API: whether it is on, its audience (the https address a
job's `server` names, on a host the door's certificate names), its policy file and its OIDC
issuer, each a verdict with the fix. The real command on the test pool, a real certificate
(doorkit's CA), the local OIDC issuer (oidckit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from doorkit import make_ca
from helpers import cli
from oidckit import Issuer, Key

POLICY = "owners:\n  - acme\n"


def doctor(env: dict[str, str], **settings: str) -> dict[str, dict[str, Any]]:
    done = cli(["doctor", "--json"], env={**env, **settings})
    return {c["name"]: c for c in json.loads(done.stdout)}


def api_settings(folder: Path, issuer: str, audience: str) -> dict[str, str]:
    certs = make_ca(folder, names=("pool.example.test",), addresses=())
    (folder / "policy.yml").write_text(POLICY)
    return {
        "PGOVERLAY_DOOR_CERT_FILE": str(certs.cert_file),
        "PGOVERLAY_DOOR_KEY_FILE": str(certs.key_file),
        "PGOVERLAY_DOOR_HTTPS_PORT": "8443",
        "PGOVERLAY_API_ISSUER": issuer,
        "PGOVERLAY_API_AUDIENCE": audience,
        "PGOVERLAY_API_POLICY_FILE": str(folder / "policy.yml"),
    }


def test_doctor_says_the_network_api_is_off_and_how_to_turn_it_on(env: dict[str, str]) -> None:
    found = doctor(env)
    assert found["network API"]["verdict"] == "ok"
    assert "PGOVERLAY_API_AUDIENCE is unset" in found["network API"]["detail"]


def test_doctor_checks_the_audience_the_policy_and_the_issuer(
    env: dict[str, str], tmp_path: Path
) -> None:
    with Issuer([Key.make("key-1")]) as issuer:
        good = api_settings(tmp_path, issuer.url, "https://pool.example.test:8443")
        found = doctor(env, **good)
        for name in ("audience", "policy", "issuer"):
            assert found[f"network API {name}"]["verdict"] == "ok", found[f"network API {name}"]
        assert "1 signing keys" in found["network API issuer"]["detail"]
        assert "owners acme" in found["network API policy"]["detail"]

        # a host the certificate does not name: every job's TLS check would fail
        misnamed = doctor(env, **{**good, "PGOVERLAY_API_AUDIENCE": "https://10.0.0.5:8443"})
        said = misnamed["network API audience"]
        assert said["verdict"] == "fail" and "10.0.0.5 is not a name on" in said["detail"]
        assert "pool.example.test" in said["detail"], said
        # not a URL at all
        bare = doctor(env, **{**good, "PGOVERLAY_API_AUDIENCE": "pool.example.test"})
        assert bare["network API audience"]["verdict"] == "fail"
        assert "https://" in bare["network API audience"]["detail"]

        (tmp_path / "policy.yml").write_text("owners: []\n")
        broken = doctor(env, **good)
        assert broken["network API policy"]["verdict"] == "fail"
        assert "policy.yml" in broken["network API policy"]["detail"]
        unreachable = issuer.url
    gone = doctor(env, **{**good, "PGOVERLAY_API_ISSUER": unreachable})
    said = gone["network API issuer"]
    assert said["verdict"] == "fail" and "cannot reach the OIDC issuer" in said["detail"], said
