"""The lvm backend without lvm: parsing, tags, error mapping, and what it runs.

The outputs and messages below were captured from lvm2 2.03.16 (Debian 12)
inside pgsnap's test VM (``pgsnap.testing.lvmvm``, kernel 6.1, ``LC_ALL=C``),
except the ``json_std`` / ``log`` document, which follows the format of
lvm2 2.03.26+ as described in lvmreport(7) (not available on Debian 12). A
fake :class:`~pgsnap.protocols.Runner` plays them back and records every
command the backend runs.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence

import pytest

from pgsnap.backends.lvm import (
    CAPABILITIES,
    LvExistsError,
    LvInUseError,
    LvmBackend,
    LvmError,
    LvmNoSpaceError,
    SnapshotInvalidError,
    VolumeGroupNotFound,
    classify_failure,
    decode_tag_value,
    encode_tag_value,
    parse_lvs_json,
)
from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    CommandTimeout,
    ConfigurationError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.host import CommandResult, Host
from pgsnap.model import LocationKind, RestorePreparation
from pgsnap.protocols import Capability
from pgsnap.testing.runners import ScriptedRunner

# Captured: lvs --reportformat json -o lv_name,vg_name,lv_attr,lv_size,origin,pool_lv,
# data_percent,snap_percent,lv_time,lv_tags --units b --nosuffix (2.03.16), plus one
# classic snapshot and one thin snapshot row from the same VM.
LVS_2_03_16 = """\
  {
      "report": [
          {
              "lv": [
                  {"lv_name":"a", "vg_name":"vg0", "lv_attr":"owi-aos---", "lv_size":"67108864", "origin":"", "pool_lv":"", "data_percent":"", "snap_percent":"", "lv_time":"2026-12-01 05:49:14 +0000", "lv_tags":""},
                  {"lv_name":"a.pgsnap.811f9000.1", "vg_name":"vg0", "lv_attr":"swi-a-s---", "lv_size":"8388608", "origin":"a", "pool_lv":"", "data_percent":"37.79", "snap_percent":"37.79", "lv_time":"2026-12-01 05:49:20 +0000", "lv_tags":"pgsnap,pgsnap.at=20261201T054920123456Z,pgsnap.group=cg-20261201T054920000001Z-811f9000,pgsnap.i=2,pgsnap.name=nightly+20+2F+20x,pgsnap.origin=a,pgsnap.v=1"},
                  {"lv_name":"[lvol0_pmspare]", "vg_name":"vg0", "lv_attr":"ewi-------", "lv_size":"4194304", "origin":"", "pool_lv":"", "data_percent":"", "snap_percent":"", "lv_time":"2026-12-01 05:49:15 +0000", "lv_tags":""},
                  {"lv_name":"pool", "vg_name":"vg0", "lv_attr":"twi-aotz--", "lv_size":"536870912", "origin":"", "pool_lv":"", "data_percent":"1.23", "snap_percent":"1.23", "lv_time":"2026-12-01 05:49:15 +0000", "lv_tags":""},
                  {"lv_name":"[pool_tdata]", "vg_name":"vg0", "lv_attr":"Twi-ao----", "lv_size":"536870912", "origin":"", "pool_lv":"", "data_percent":"", "snap_percent":"", "lv_time":"2026-12-01 05:49:15 +0000", "lv_tags":""},
                  {"lv_name":"t", "vg_name":"vg0", "lv_attr":"Vwi-aotz--", "lv_size":"67108864", "origin":"", "pool_lv":"pool", "data_percent":"9.86", "snap_percent":"9.86", "lv_time":"2026-12-01 05:49:16 +0000", "lv_tags":""},
                  {"lv_name":"t.pgsnap.811f9000.1", "vg_name":"vg0", "lv_attr":"Vwi---tz-k", "lv_size":"67108864", "origin":"t", "pool_lv":"pool", "data_percent":"", "snap_percent":"", "lv_time":"2026-12-01 05:49:20 +0000", "lv_tags":"pgsnap,pgsnap.at=20261201T054920000002Z,pgsnap.group=cg-20261201T054920000001Z-811f9000,pgsnap.i=1,pgsnap.name=nightly+20+2F+20x,pgsnap.origin=t,pgsnap.v=1"}
              ]
          }
      ]
  }
"""

# The json_std format of lvm2 >= 2.03.17 (numbers, null, arrays) with the top-level
# "log" array that 2.03.26+ adds, per lvmreport(7).
LVS_JSON_STD = """{
  "report": [
    {"lv": [
      {"lv_name":"t", "vg_name":"vg0", "lv_attr":"Vwi-a-tz--", "lv_size":67108864,
       "origin":null, "pool_lv":"pool", "data_percent":9.86, "snap_percent":null,
       "lv_time":"2026-12-01 05:49:16 +0000", "lv_tags":[]},
      {"lv_name":"t.pgsnap.811f9000.1", "vg_name":"vg0", "lv_attr":"Vwi---tz-k",
       "lv_size":67108864, "origin":"t", "pool_lv":"pool", "data_percent":null,
       "snap_percent":null, "lv_time":"2026-12-01 05:49:20 +0000",
       "lv_tags":["pgsnap", "pgsnap.at=20261201T054920000002Z",
                  "pgsnap.group=cg-20261201T054920000001Z-811f9000", "pgsnap.i=1",
                  "pgsnap.name=n", "pgsnap.origin=t", "pgsnap.v=1"]}
    ]}
  ],
  "log": [
    {"log_seq_num":1, "log_type":"status", "log_context":"shell", "log_object_type":"cmd",
     "log_object_name":"", "log_object_id":"", "log_object_group":"",
     "log_object_group_id":"", "log_message":"success", "log_errno":0, "log_ret_code":1}
  ]
}
"""

# Captured stderr (exit status) of real lvm2 2.03.16 commands in the VM.
MESSAGES = {
    "vg_not_found": (
        5,
        '  Volume group "nosuch" not found\n  Cannot process volume group nosuch\n',
    ),
    "lv_exists": (5, '  Logical Volume "a" already exists in volume group "vg0"\n'),
    "vg_exists": (5, "  A volume group called vg0 already exists.\n"),
    "no_space": (
        5,
        '  Volume group "vg0" has insufficient free space (875 extents): 25600 required.\n',
    ),
    "in_use": (5, "  Logical volume vg0/a contains a filesystem in use.\n"),
    "invalid": (5, "  Unable to merge invalidated snapshot LV vg0/as.\n"),
    "suspend_busy": (
        5,
        "  device-mapper: suspend ioctl on  (253:0) failed: Device or resource busy\n"
        "  Unable to suspend vg0-a (253:0)\n  Failed to suspend logical volume vg0/a.\n",
    ),
    "bad_tag": (
        3,
        "  Invalid argument for --addtag: a b\n  Error during parsing of command line.\n",
    ),
    "no_dm": (
        5,
        "  /dev/mapper/control: open failed: No such device\n"
        "  Failure to communicate with kernel device-mapper driver.\n"
        "  Check that device-mapper is available in the kernel.\n",
    ),
    "lv_not_found": (5, '  Failed to find logical volume "vg0/nosuch"\n'),
}

EXPECTED = {
    "vg_not_found": VolumeGroupNotFound,
    "lv_exists": LvExistsError,
    "vg_exists": LvExistsError,
    "no_space": LvmNoSpaceError,
    "in_use": LvInUseError,
    "invalid": SnapshotInvalidError,
    "suspend_busy": LvInUseError,
    "bad_tag": LvmError,
    "no_dm": LvmError,
    "lv_not_found": LvmError,
}


def result(key: str, argv: Sequence[str] = ("lvcreate",)) -> CommandResult:
    code, err = MESSAGES[key]
    return CommandResult(tuple(argv), code, b"", err.encode())


# --------------------------------------------------------------------------- parsing


def test_parse_lvs_2_03_16_strings() -> None:
    lvs = {lv.name: lv for lv in parse_lvs_json(LVS_2_03_16)}
    assert lvs["a"].size == 67108864 and lvs["a"].kind == "o" and lvs["a"].open
    snap = lvs["a.pgsnap.811f9000.1"]
    assert snap.classic_snapshot and snap.snap_percent == pytest.approx(37.79)
    assert snap.origin == "a" and snap.tag("group") == "cg-20261201T054920000001Z-811f9000"
    assert lvs["t"].thin and lvs["t"].pool == "pool" and lvs["t"].data_percent == 9.86
    assert lvs["t.pgsnap.811f9000.1"].skip_activation
    assert not lvs["t.pgsnap.811f9000.1"].active
    assert lvs["[pool_tdata]"].hidden and lvs["[pool_tdata]"].bare_name == "pool_tdata"
    assert lvs["a"].tags == () and lvs["a"].data_percent is None


def test_parse_lvs_json_std_numbers_nulls_arrays_and_log() -> None:
    lvs = {lv.name: lv for lv in parse_lvs_json(LVS_JSON_STD)}
    assert set(lvs) == {"t", "t.pgsnap.811f9000.1"}
    assert lvs["t"].size == 67108864 and lvs["t"].origin == "" and lvs["t"].tags == ()
    assert lvs["t.pgsnap.811f9000.1"].tag("origin") == "t"
    assert lvs["t.pgsnap.811f9000.1"].pgsnap


@pytest.mark.parametrize(
    "text",
    ["not json at all", '{"no_report": []}', '{"report": '],
)
def test_parse_lvs_rejects_what_is_not_a_report(text: str) -> None:
    with pytest.raises(LvmError):
        parse_lvs_json(text)


def test_parse_lvs_empty_output_is_no_lv() -> None:
    assert parse_lvs_json("") == ()


@pytest.mark.parametrize(
    "name",
    ["nightly", "nightly backup: 2026/12/01", "ü 100% +x", "", "a,b c=d"],
)
def test_tag_values_use_lvm_tag_characters_and_round_trip(name: str) -> None:
    encoded = encode_tag_value(name)
    assert all(c.isascii() and (c.isalnum() or c in "_+.-") for c in encoded)
    assert decode_tag_value(encoded) == name


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("key", sorted(MESSAGES))
def test_real_messages_become_typed_errors(key: str) -> None:
    err = classify_failure(result(key), what="the command", volume_id="vg0/a")
    assert type(err) is EXPECTED[key]
    assert isinstance(err, BackendError)
    assert err.hint
    assert err.details["backend"] == "lvm"
    assert err.details["returncode"] == MESSAGES[key][0]
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err) and str(copy) == str(err)


def test_missing_lvm_says_to_install_it() -> None:
    err = classify_failure(CommandResult(("lvs",), 127, b"", b"lvs: not found"), what="x")
    assert "lvm2" in str(err) and "apt-get install lvm2" in (err.hint or "")


def test_vg_not_found_names_the_volume_group() -> None:
    err = classify_failure(result("vg_not_found"), what="listing")
    assert err.details["volume_group"] == "nosuch"


# --------------------------------------------------------------------------- with a fake runner


class FakeRunner(ScriptedRunner):
    """Plays back ``lvs`` output and records every command."""

    description = "fake"

    def __init__(self, lvs_text: str = LVS_2_03_16) -> None:
        super().__init__()
        self.lvs_text = lvs_text
        self.fail: dict[str, CommandResult] = {}
        self.timeout = False
        self.merges = True
        self.gone: set[str] = set()
        self.made: list[dict[str, str]] = []

    def default(self, args: list[str]) -> CommandResult:
        assert args[:3] == ["env", "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1"], args
        command = args[3]
        if self.timeout:
            raise CommandTimeout("slow", argv=tuple(args), returncode=-1, stderr="", timeout=60.0)
        if command in self.fail:
            return self.fail[command]
        if command == "lvconvert" and self.merges:
            self.gone.add(args[-1].split("/")[1])  # merged at once: the snapshot is gone
        if command == "lvs":
            doc = json.loads(self.lvs_text)
            rows = doc["report"][0]["lv"] + self.made
            doc["report"][0]["lv"] = [r for r in rows if r["lv_name"] not in self.gone]
            return self.ok(args, json.dumps(doc).encode())
        if command == "lvcreate" and "-kn" in args:  # a clone: a new inactive thin LV
            name = args[args.index("-n") + 1]
            tags = [args[i + 1] for i, a in enumerate(args) if a == "--addtag"]
            self.made.append(
                {
                    "lv_name": name,
                    "vg_name": "vg0",
                    "lv_attr": "Vwi---tz--",
                    "lv_size": "67108864",
                    "origin": args[-1].split("/")[1],
                    "pool_lv": "pool",
                    "data_percent": "",
                    "snap_percent": "",
                    "lv_time": "2026-12-01 05:50:00 +0000",
                    "lv_tags": ",".join(tags),
                }
            )
        if command == "lvremove":
            self.gone.add(args[-1].split("/")[1])
        return self.ok(args)

    def issued(self) -> list[tuple[str, ...]]:
        """The commands but ``lvs``, without the ``env`` prefix."""
        return [tuple(c[3:]) for c in self.calls if c[3] != "lvs"]


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def backend(runner: FakeRunner) -> LvmBackend:
    return LvmBackend("vg0", host=Host(runner))


def test_volumes_are_the_plain_origin_and_thin_lvs(backend: LvmBackend) -> None:
    assert [v.id for v in backend.list_volumes()] == ["vg0/a", "vg0/t"]
    t = backend.get_volume("vg0/t")
    assert t.extra["kind"] == "thin" and t.extra["pool"] == "pool" and t.path == "/dev/vg0/t"
    for not_a_volume in ("vg0/pool", "vg0/[pool_tdata]", "vg0/a.pgsnap.811f9000.1", "a", "x/a"):
        with pytest.raises(VolumeNotFound):
            backend.get_volume(not_a_volume)
    assert backend.locate("vg0/a").kind is LocationKind.BLOCK_DEVICE


def test_snapshots_and_groups_come_from_the_tags(backend: LvmBackend) -> None:
    snaps = backend.list_snapshots()
    assert [s.id for s in snaps] == ["vg0/t.pgsnap.811f9000.1", "vg0/a.pgsnap.811f9000.1"]
    assert snaps[0].extra["kind"] == "thin" and snaps[1].extra["kind"] == "classic"
    assert snaps[1].extra["used_percent"] == "37.79"
    group = backend.get_snapshot_group("cg-20261201T054920000001Z-811f9000")
    assert group.name == "nightly / x"
    assert [s.volume_id for s in group.snapshots] == ["vg0/t", "vg0/a"]
    assert [s.id for s in backend.list_snapshots("vg0/a")] == ["vg0/a.pgsnap.811f9000.1"]


def test_profiles_say_what_a_merge_costs(backend: LvmBackend) -> None:
    thin, classic = backend.restore_profile("vg0/t"), backend.restore_profile("vg0/a")
    assert thin.before is classic.before is RestorePreparation.UNMOUNT
    assert not thin.consumes_snapshot and classic.consumes_snapshot
    assert not thin.completes_later and not classic.completes_later


def test_create_runs_thin_and_classic_lvcreate_with_tags(runner: FakeRunner) -> None:
    runner.lvs_text = LVS_2_03_16.replace('"owi-aos---"', '"-wi-a-----"')
    backend = LvmBackend("vg0", host=Host(runner), cow_size="50%ORIGIN")
    with pytest.raises(SnapshotNotFound):  # the fake lists no new LV afterwards
        backend.create_snapshot_group(["vg0/t", "vg0/a"], "n a/m")
    thin, classic = [c for c in runner.issued() if c[0] == "lvcreate"]
    assert "-L" not in thin and "-l" not in thin and thin[-1] == "vg0/t"
    # Half of a's 67108864 bytes, in bytes: lvm would clamp "-l 50%ORIGIN" silently.
    assert classic[classic.index("-L") + 1] == "33554432b" and classic[-1] == "vg0/a"
    tags = [thin[i + 1] for i, a in enumerate(thin) if a == "--addtag"]
    assert "pgsnap" in tags and "pgsnap.origin=t" in tags and "pgsnap.name=n+20a+2Fm" in tags
    assert all(c.isalnum() or c in "_+.-/=!:#&" for tag in tags for c in tag)


def test_a_failed_group_removes_what_it_took(runner: FakeRunner) -> None:
    calls = {"n": 0}
    original = runner.run

    def run(argv: Sequence[str], **kw: object) -> CommandResult:
        if argv[3] == "lvcreate":
            calls["n"] += 1
            if calls["n"] == 2:
                runner.calls.append(list(argv))
                return result("no_space", argv)
        return original(argv, **kw)  # type: ignore[arg-type]

    runner.run = run  # type: ignore[method-assign]
    backend = LvmBackend("vg0", host=Host(runner))
    with pytest.raises(LvmNoSpaceError, match="vg0/a") as info:
        backend.create_snapshot_group(["vg0/t", "vg0/a"], "g")
    assert info.value.details["volume_id"] == "vg0/a"
    removed = [c for c in runner.issued() if c[0] == "lvremove"]
    assert removed and removed[0][-1].startswith("vg0/t.pgsnap.")


def test_restore_refuses_before_running_lvconvert(backend: LvmBackend, runner) -> None:
    with pytest.raises(BackendError, match="only restore its own volume"):
        backend.restore_volume("vg0/t", "vg0/a.pgsnap.811f9000.1")
    with pytest.raises(LvInUseError, match="open"):  # a is open (owi-aos---)
        backend.restore_volume("vg0/a", "vg0/a.pgsnap.811f9000.1")
    runner.lvs_text = LVS_2_03_16.replace('"swi-a-s---"', '"swi-I-s---"').replace(
        '"owi-aos---"', '"owi-a-s---"'
    )
    with pytest.raises(SnapshotInvalidError):
        backend.restore_volume("vg0/a", "vg0/a.pgsnap.811f9000.1")
    assert backend.list_snapshots("vg0/a")[0].extra["state"] == "invalid"
    assert any("invalid" in p for p in backend.ex_check())
    assert not [c for c in runner.issued() if c[0] == "lvconvert"]


def test_thin_restore_swaps_in_a_copy_of_the_snapshot(runner) -> None:
    """Thin: no merge (it would cut every other snapshot's origin link): a snapshot of
    the backup's snapshot replaces the volume, which is removed; the backup stays."""
    backend = LvmBackend("vg0", host=Host(runner))
    runner.lvs_text = LVS_2_03_16.replace('"Vwi-aotz--"', '"Vwi-a-tz--"')
    backend.restore_volume("vg0/t", "vg0/t.pgsnap.811f9000.1")
    commands = runner.issued()
    assert [c[0] for c in commands[:4]] == ["lvcreate", "lvchange", "lvchange", "lvrename"]
    assert not [c for c in commands if c[0] == "lvconvert"]
    create, activate, tag, rename = commands[:4]
    new = create[create.index("-n") + 1]
    assert create[-1] == "vg0/t.pgsnap.811f9000.1" and "pgsnap.new=t" in create
    assert new.startswith("t.pgsnapnew.") and "-ky" in create
    assert activate == ("lvchange", "-kn", "-ay", f"vg0/{new}")
    assert tag == ("lvchange", "--addtag", "pgsnap.old=t", "vg0/t")
    assert rename[:3] == ("lvrename", "vg0", "t") and rename[3].startswith("t.pgsnapold.")


def test_a_deferred_merge_reactivates_the_origin(runner) -> None:
    runner.lvs_text = LVS_2_03_16.replace('"owi-aos---"', '"owi-a-s---"')
    runner.fail["lvconvert"] = CommandResult(
        ("lvconvert",),
        0,
        b"  Delaying merge since origin is open.\n"
        b"  Merging of snapshot vg0/a.pgsnap.811f9000.1 will occur on next activation of vg0/a.\n",
        b"",
    )
    runner.merges = False
    backend = LvmBackend("vg0", host=Host(runner), merge_timeout=0.01)
    with pytest.raises(LvmError, match="did not finish"):  # the fake never merges
        backend.restore_volume("vg0/a", "vg0/a.pgsnap.811f9000.1")
    assert [c[:2] for c in runner.issued()] == [
        ("lvconvert", "--merge"),
        ("lvchange", "-an"),
        ("lvchange", "-ay"),
    ]


def test_a_thin_snapshot_is_cloned_as_an_active_tagged_thin_volume(
    backend: LvmBackend, runner: FakeRunner
) -> None:
    assert backend.restore_profile("vg0/t").clone_refusal == ""
    clone = backend.clone_snapshot("vg0/t.pgsnap.811f9000.1", "pgc-dev-1a2b3c")
    assert clone.id == "vg0/pgc-dev-1a2b3c" and clone.path == "/dev/vg0/pgc-dev-1a2b3c"
    assert clone.id in {v.id for v in backend.list_volumes()}  # a volume like the others
    assert clone.id not in {s.id for s in backend.list_snapshots()}
    assert runner.issued() == [
        (
            "lvcreate",
            "-s",
            "-n",
            "pgc-dev-1a2b3c",
            "-kn",
            "--addtag",
            "pgsnap.clone=t.pgsnap.811f9000.1",
            "vg0/t.pgsnap.811f9000.1",
        ),
        ("lvchange", "-ay", "vg0/pgc-dev-1a2b3c"),
    ]
    # Deleted by delete_clone only; an origin is never deleted; a clone gone is fine.
    with pytest.raises(LvmError, match="not a clone"):
        backend.delete_clone("vg0/t")
    backend.delete_clone("vg0/pgc-dev-1a2b3c")
    backend.delete_clone("vg0/pgc-dev-1a2b3c")
    assert runner.issued()[-1] == ("lvremove", "-y", "vg0/pgc-dev-1a2b3c")
    assert [c[0] for c in runner.issued()].count("lvremove") == 1
    with pytest.raises(ConfigurationError):
        backend.clone_snapshot("vg0/t.pgsnap.811f9000.1", "bad name")


def test_a_classic_snapshot_is_not_cloned_and_its_profile_says_why(
    backend: LvmBackend, runner: FakeRunner
) -> None:
    refusal = backend.restore_profile("vg0/a").clone_refusal
    assert "classic LVM snapshot cannot be snapshotted" in refusal
    with pytest.raises(UnsupportedCapability, match="cannot be snapshotted") as info:
        backend.clone_snapshot("vg0/a.pgsnap.811f9000.1", "pgc-dev-1a2b3c")
    assert "thin" in (info.value.hint or "")
    assert runner.issued() == []


def test_unsupported_and_unavailable(backend: LvmBackend, runner) -> None:
    assert backend.capabilities == CAPABILITIES == frozenset({Capability.CLONES})
    for call in (
        lambda: backend.attach("vg0/a", "h"),
        lambda: backend.detach("vg0/a", "h"),
        lambda: backend.pause_policy("p"),
        lambda: backend.create_snapshot_group(["vg0/a"], "s", secure=True),
    ):
        with pytest.raises(UnsupportedCapability):
            call()
    runner.timeout = True
    with pytest.raises(BackendUnavailable):
        backend.list_volumes()


@pytest.mark.parametrize(
    "options",
    [
        {"volume_group": ""},
        {"volume_group": "-x"},
        {"volume_group": "vg", "cow_size": "lots"},
        {"volume_group": "vg", "cow_size": "0%ORIGIN"},
        {"volume_group": "vg", "cow_size": 0},
        {"volume_group": "vg", "command_timeout": 0},
    ],
)
def test_bad_configuration_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        LvmBackend(**options)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- storage problems

_COPY_ROW = (
    '{"lv_name":"t.pgsnapnew.0badc0de", "vg_name":"vg0", "lv_attr":"Vwi---tz-k", '
    '"lv_size":"67108864", "origin":"t.pgsnap.811f9000.1", "pool_lv":"pool", '
    '"data_percent":"", "snap_percent":"", "lv_time":"2026-12-01 05:50:00 +0000", '
    '"lv_tags":"pgsnap.new=t"}'
)


def _with_copy(text: str) -> str:
    anchor = '{"lv_name":"t", "vg_name":"vg0"'
    return text.replace(anchor, _COPY_ROW + ",\n" + anchor, 1)


def test_storage_problems_of_snapshots_pools_and_leftovers(runner: FakeRunner) -> None:
    from pgsnap.model import Severity
    from pgsnap.protocols import StorageHealth

    backend = LvmBackend("vg0", host=Host(runner), warn_percent=30)
    assert isinstance(backend, StorageHealth)
    # The classic snapshot of a is 37.79 % full: above 30 %, a warning with what to do.
    (filling,) = backend.storage_problems()
    assert (filling.code, filling.severity) == ("snapshot_filling", Severity.WARNING)
    assert (filling.volume_id, filling.snapshot_id) == ("vg0/a", "vg0/a.pgsnap.811f9000.1")
    assert filling.percent_used == pytest.approx(37.79) and "lvextend" in filling.hint
    assert backend.storage_problems(["vg0/t"]) == ()  # only the volumes asked about
    # Invalid, a pool nearly full, and a copy an interrupted restore left behind.
    runner.lvs_text = _with_copy(
        LVS_2_03_16.replace('"swi-a-s---"', '"swi-I-s---"').replace(
            '"data_percent":"1.23", "snap_percent":"1.23"',
            '"data_percent":"92.50", "snap_percent":"92.50"',
        )
    )
    problems = backend.storage_problems()
    assert [(p.code, p.severity) for p in problems] == [
        ("snapshot_invalid", Severity.ERROR),
        ("pool_filling", Severity.WARNING),
        ("restore_leftover", Severity.WARNING),
    ]
    assert problems[0].snapshot_id == "vg0/a.pgsnap.811f9000.1" and problems[0].hint
    assert "vg0/pool" in problems[1].message
    assert problems[2].volume_id == "vg0/t"
    assert [p.code for p in backend.storage_problems(["vg0/t"])] == [
        "pool_filling",
        "restore_leftover",
    ]
    assert [p.code for p in backend.storage_problems(["vg0/a"])] == ["snapshot_invalid"]
    # ex_check keeps saying the same, one sentence each, with what to do.
    sentences = backend.ex_check()
    assert len(sentences) == 3 and "invalid" in sentences[0] and "lvextend" in sentences[1]
    # A full pool stops its thin volumes: an error.
    runner.lvs_text = LVS_2_03_16.replace(
        '"data_percent":"1.23", "snap_percent":"1.23"',
        '"data_percent":"100.00", "snap_percent":"100.00"',
    )
    (full,) = [p for p in backend.storage_problems() if p.code == "pool_filling"]
    assert full.severity is Severity.ERROR and "stop" in full.message


# --------------------------------------------------------------------------- exposed for a copy


def test_snapshots_are_exposed_by_activation_on_their_own_host(
    runner: FakeRunner, backend: LvmBackend
) -> None:
    """Issue 21: a thin snapshot (activation skipped) is activated to be read, a classic
    one is active with its origin; concealing deactivates only an active thin one; any
    other host is refused, and the origin is never touched."""
    from pgsnap.model import Location
    from pgsnap.protocols import ExposableSnapshots

    assert isinstance(backend, ExposableSnapshots)
    here = backend.host.name
    assert backend.expose_snapshot("vg0/t.pgsnap.811f9000.1", here) == Location.device(
        "/dev/vg0/t.pgsnap.811f9000.1"
    )
    assert backend.expose_snapshot("vg0/a.pgsnap.811f9000.1", here).path == (
        "/dev/vg0/a.pgsnap.811f9000.1"
    )
    assert runner.issued() == [("lvchange", "-ay", "-K", "vg0/t.pgsnap.811f9000.1")]
    backend.conceal_snapshot("vg0/t.pgsnap.811f9000.1", here)  # listed inactive: nothing to do
    backend.conceal_snapshot("vg0/gone.pgsnap.811f9000.1", here)  # gone: fine
    runner.lvs_text = LVS_2_03_16.replace('"Vwi---tz-k"', '"Vwi-a-tz-k"')
    backend.conceal_snapshot("vg0/t.pgsnap.811f9000.1", here)
    backend.conceal_snapshot("vg0/a.pgsnap.811f9000.1", here)  # classic: stays with its origin
    assert runner.issued()[1:] == [("lvchange", "-an", "vg0/t.pgsnap.811f9000.1")]
    with pytest.raises(LvmError, match="only on"):
        backend.expose_snapshot("vg0/t.pgsnap.811f9000.1", "backup1")
    with pytest.raises(SnapshotNotFound):
        backend.expose_snapshot("vg0/t", here)  # an origin is not a snapshot


def test_read_only_mount_options_depend_on_the_file_system() -> None:
    from pgsnap.host.readonly import file_system_type, read_only_mount_options

    xfs = b"XFSB" + bytes(4092)
    ext4 = bytearray(4096)
    ext4[1080:1082] = b"\x53\xef"
    assert file_system_type(xfs) == "xfs" and file_system_type(bytes(ext4)) == "ext4"
    assert file_system_type(b"") is None
    assert read_only_mount_options("xfs") == ("nouuid", "ro", "norecovery")
    assert read_only_mount_options("ext4") == ("ro", "noload")
    assert read_only_mount_options(None) == ("ro",)
    assert read_only_mount_options("xfs", read_only=False) == ("nouuid",)


def test_an_observation_lists_the_volume_group_once(
    backend: LvmBackend, runner: FakeRunner
) -> None:
    """Issue 27 ("fewer storage calls"), and half the LVM tests' time in the emulated VM:
    the questions one observation asks share one ``lvs``; a change drops it; the next
    observation lists again, so a freshness check sees what changed meanwhile."""

    def listings() -> int:
        return sum(1 for c in runner.calls if c[3] == "lvs")

    with backend.observation():
        backend.list_volumes()
        backend.locate("vg0/a")
        backend.restore_profile("vg0/t")
        backend.list_snapshots()
        with backend.observation():  # nested: the same listing
            backend.get_volume("vg0/t")
        assert listings() == 1
        backend.delete_snapshot("vg0/a.pgsnap.811f9000.1")  # a change
        after = listings()
        assert backend.list_snapshots("vg0/a") == ()  # the change is seen
        backend.list_volumes()
        assert listings() == after + 1  # listed once again after the change, then shared
    backend.list_volumes()
    backend.list_volumes()
    assert listings() == after + 3  # outside an observation: every call lists
    with backend.observation():
        runner.gone.add("t")  # another process removes an LV between two observations
        assert [v.id for v in backend.list_volumes()] == ["vg0/a"]
