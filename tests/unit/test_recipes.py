"""The scheduler recipes of docs/recipes (issue 25), checked with what can check them
here: the systemd units by `systemd-analyze verify` (pointing at this machine's pgsnap),
the CronJob against Kubernetes' own OpenAPI schema (kubernetes-validate, strict), and
the command every recipe runs, parsed by pgsnap's own parser. (The cron line's command
is run against a real fleet in tests/integration/test_cli_fleet.py.)"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pgsnap.cli import _parser

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes"
COMMAND = "backup -c /etc/pgsnap/fleet.toml --all --if-older-than 50min --cluster-timeout 30min"


def cron_command() -> list[str]:
    """The command of the cron recipe's one entry (after 5 time fields and the user)."""
    entries = [
        line
        for line in (RECIPES / "pgsnap-backup.cron").read_text().splitlines()
        if line and not line.startswith("#") and "=" not in line.split()[0]
    ]
    (entry,) = entries
    fields = entry.split(None, 6)
    minute, hour, dom, month, dow, user, command = fields
    assert 0 <= int(minute) <= 59 and (hour, dom, month, dow) == ("*", "*", "*", "*")
    assert user == "postgres"
    return shlex.split(command)


def test_every_recipe_runs_the_documented_command() -> None:
    cron = cron_command()
    assert cron[0] == "/usr/local/bin/pgsnap" and " ".join(cron[1:]) == COMMAND
    service = (RECIPES / "pgsnap-backup.service").read_text()
    assert f"ExecStart=/usr/local/bin/pgsnap {COMMAND}\n" in service
    job = yaml.safe_load((RECIPES / "pgsnap-backup-cronjob.yaml").read_text())
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert " ".join(container["args"]) == COMMAND
    args = _parser().parse_args(shlex.split(COMMAND))
    assert (args.command, args.all, args.if_older_than, args.cluster_timeout) == (
        "backup",
        True,
        "50min",
        "30min",
    )


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    pgsnap = shutil.which("pgsnap")
    if analyze is None or pgsnap is None:
        pytest.skip(f"systemd-analyze ({analyze}) and an installed pgsnap ({pgsnap}) needed")
    for name in ("pgsnap-backup.service", "pgsnap-backup.timer"):
        text = (RECIPES / name).read_text().replace("/usr/local/bin/pgsnap", pgsnap)
        (tmp_path / name).write_text(text)
    proc = subprocess.run(
        [analyze, "verify", str(tmp_path / "pgsnap-backup.service"),
         str(tmp_path / "pgsnap-backup.timer")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    timer = (RECIPES / "pgsnap-backup.timer").read_text()
    assert "Persistent=true" in timer  # a start missed while down runs at boot


def test_the_cronjob_is_a_valid_kubernetes_object_that_never_overlaps() -> None:
    job = yaml.safe_load((RECIPES / "pgsnap-backup-cronjob.yaml").read_text())
    kubernetes_validate.validate(job, "1.31", strict=True)  # raises on any error
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    spec = dict(job["spec"])
    spec["concurencyPolicy"] = spec.pop("concurrencyPolicy")  # a typo Kubernetes would drop
    broken = {**job, "spec": spec}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.31", strict=True)
