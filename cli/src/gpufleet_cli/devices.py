"""`gpufleet device ...`: edge devices, their configurations and rollouts (R-DEV-1..3)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from gpufleet_client import reply_model
from gpufleet_contracts.base import Command
from gpufleet_contracts.devices import (
    AddDevice,
    AddDeviceConfig,
    CancelRollout,
    DeployConfig,
    DeviceConfigList,
    DeviceList,
    DeviceTokenIssued,
    IssueDeviceToken,
    ListDeviceConfigs,
    ListDevices,
    ListRollouts,
    RemoveDevice,
    RemoveDeviceConfig,
    RolloutList,
    SetDeviceConfig,
    ShowDevice,
    ShowDeviceConfig,
    ShowRollout,
)
from rich.markup import escape
from rich.table import Table

from . import render
from .common import JsonFlag, answer, build

app = typer.Typer(
    help="Edge devices (Jetson), their configurations and rollouts.", no_args_is_help=True
)
config_app = typer.Typer(help="Device configurations of a region.", no_args_is_help=True)
rollout_app = typer.Typer(
    help="Rollouts: how far a deployment got, and cancelling it.", no_args_is_help=True
)
app.add_typer(config_app, name="config")
app.add_typer(rollout_app, name="rollout")

DeviceArg = Annotated[str, typer.Argument(help="name, minion id or device id")]
RegionOption = Annotated[str, typer.Option("--region", help="one of your regions")]


def _act(request: Command, as_json: bool, title: str) -> dict[str, Any]:
    """Send a request; print its reply as one object (field, value)."""
    reply = render.plain(answer(request, reply_model(request), as_json))
    if not as_json:
        _fields(reply, title)
    return reply


def _fields(obj: dict[str, Any], title: str) -> None:
    table = Table("Field", "Value", title=title, title_justify="left")
    for k, v in obj.items():
        if k != "devices" or not isinstance(v, list):
            table.add_row(k, render.text(v))
    render.out().print(table)


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="unique in its region")],
    region: RegionOption,
    minion_id: Annotated[str, typer.Option("--minion-id", help="on the device's sticker")],
    model: Annotated[
        str,
        typer.Option(
            help="jetson-agx-xavier | jetson-xavier-nx | jetson-agx-orin | jetson-orin-nx | "
            "jetson-orin-nano"
        ),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Add a device to a central region with an active storage node (R-DEV-1, R-NODE-3)."""
    request = build(AddDevice, as_json, region=region, name=name, minion_id=minion_id, model=model)
    _act(request, as_json, f"device {name} added")


@app.command("list")
def list_(
    region: Annotated[str | None, typer.Option("--region", help="only this region")] = None,
    all_: Annotated[bool, typer.Option("--all", help="removed devices too")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Your devices: state, online or offline (last seen), configuration, deployment,
    inference, last deployed."""
    request = build(ListDevices, as_json, region=region, include_removed=all_)
    reply = answer(request, DeviceList, as_json)
    if as_json:
        return
    table = Table(
        "Region", "Name", "Model", "State", "Seen", "Config", "Deploy", "Inference", "Deployed"
    )
    for d in reply.devices:
        deploy = d.deploy_state.value + (f" ({d.deploy_reason})" if d.deploy_reason else "")
        table.add_row(
            escape(d.region),
            escape(d.name),
            d.model.value,
            d.state.value,
            d.presence.value
            + (f" ({render.when(d.last_seen.isoformat(), short=True)})" if d.last_seen else ""),
            escape(d.config or "-"),
            escape(deploy),
            d.inference.value if d.inference else "-",
            render.when(d.deployed_at.isoformat() if d.deployed_at else None),
        )
    render.out().print(table)


@app.command("show")
def show(device: DeviceArg, as_json: JsonFlag = False) -> None:
    """One device: its state, whether it is online (its last heartbeat and telemetry), its
    configuration, deployment state with its reason, inference status and when its
    configuration was last deployed."""
    _act(build(ShowDevice, as_json, device=device), as_json, f"device {device}")


@app.command("remove")
def remove(device: DeviceArg, as_json: JsonFlag = False) -> None:
    """Remove a device (its daily fee stops after today, R-BILL-3)."""
    _act(build(RemoveDevice, as_json, device=device), as_json, f"device {device} removed")


@app.command("token")
def token(
    device: DeviceArg,
    ttl_s: Annotated[int, typer.Option("--ttl-s", help="how long it is good for")] = 24 * 3600,
    as_json: JsonFlag = False,
) -> None:
    """A one-time join token for the device's agent (GPUFLEET_JOIN_TOKEN); shown once."""
    request = build(IssueDeviceToken, as_json, device=device, ttl_s=ttl_s)
    reply = answer(request, DeviceTokenIssued, as_json)
    if not as_json:
        render.out().print(reply.token, soft_wrap=True)
        render.err().print(f"one-time token for {reply.minion_id} in {reply.region}")


@app.command("set-config")
def set_config(
    device: DeviceArg,
    config: Annotated[
        str | None, typer.Argument(help="a configuration of the device's region")
    ] = None,
    none: Annotated[bool, typer.Option("--none", help="run no configuration")] = False,
    as_json: JsonFlag = False,
) -> None:
    """The configuration the device runs (one at a time); `device deploy` deploys it."""
    if (config is None) == (not none):
        raise typer.BadParameter("name a configuration, or --none")
    request = build(SetDeviceConfig, as_json, device=device, config=None if none else config)
    _act(request, as_json, f"device {device}")


@app.command("deploy")
def deploy(
    devices: Annotated[list[str] | None, typer.Argument(help="devices (or --config)")] = None,
    config: Annotated[str | None, typer.Option(help="every device using it: deploy latest")] = None,
    region: Annotated[str | None, typer.Option(help="the configuration's region")] = None,
    canary: Annotated[int, typer.Option(help="devices deployed first, alone")] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 10,
    max_failed_percent: Annotated[
        int, typer.Option("--max-failed-percent", help="stop at this share of failures")
    ] = 20,
    min_tried: Annotated[
        int, typer.Option("--min-tried", help="judge the share after this many")
    ] = 1,
    timeout_s: Annotated[
        int, typer.Option("--timeout-s", help="a device not running by then failed")
    ] = 900,
    as_json: JsonFlag = False,
) -> None:
    """Deploy as a rollout: a canary first, then batches; stopped when failures pass the
    threshold; `device rollout cancel` stops it at any stage."""
    policy = {
        "canary": canary,
        "batch_size": batch_size,
        "max_failed_percent": max_failed_percent,
        "min_tried": min_tried,
        "device_timeout_s": timeout_s,
    }
    request = build(
        DeployConfig, as_json, devices=devices or [], config=config, region=region, policy=policy
    )
    reply = _act(request, as_json, "rollout")
    if not as_json:
        _rollout_devices(reply)


def _rollout_devices(reply: dict[str, Any]) -> None:
    table = Table("Wave", "Device", "State", "Reason")
    for d in reply.get("devices") or []:
        table.add_row(str(d["wave"]), escape(d["name"]), d["state"], escape(d.get("reason") or ""))
    render.out().print(table)


# --- configurations -----------------------------------------------------------------------


@config_app.command("add")
def config_add(
    name: Annotated[str, typer.Argument(help="unique in its region")],
    region: RegionOption,
    image: Annotated[str, typer.Option(help="the container image")],
    model: Annotated[str, typer.Option(help="the model it serves")],
    start_command: Annotated[str, typer.Option("--start-command", help="runs in the foreground")],
    checkpoint: Annotated[list[str] | None, typer.Option("--checkpoint", help="repeatable")] = None,
    datastore: Annotated[str | None, typer.Option(help="a datastore of the region")] = None,
    datastore_path: Annotated[str, typer.Option("--datastore-path")] = "/",
    output_path: Annotated[
        str, typer.Option("--output-path", help="where it is mounted")
    ] = "/opt/ml/output",
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE (repeatable)")
    ] = None,
    key: Annotated[
        list[str] | None, typer.Option("--key", help="an attached key type (repeatable)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Add a device configuration to a region (R-DEV-2)."""
    pairs = [e.partition("=") for e in env or []]
    if any(not sep for _, sep, _ in pairs):
        raise typer.BadParameter("--env takes NAME=VALUE")
    request = build(
        AddDeviceConfig,
        as_json,
        region=region,
        name=name,
        image=image,
        model=model,
        start_command=start_command,
        checkpoints=checkpoint or [],
        datastore=datastore,
        datastore_path=datastore_path,
        output_path=output_path,
        env={k: v for k, _, v in pairs},
        keys=key or [],
    )
    _act(request, as_json, f"device configuration {name} added")


@config_app.command("list")
def config_list(
    region: Annotated[str | None, typer.Option("--region", help="only this region")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your device configurations and how many devices use each."""
    reply = answer(build(ListDeviceConfigs, as_json, region=region), DeviceConfigList, as_json)
    if as_json:
        return
    table = Table("Region", "Name", "Image", "Model", "Devices")
    for c in reply.configs:
        table.add_row(
            escape(c.region), escape(c.name), escape(c.image), escape(c.model), str(c.devices)
        )
    render.out().print(table)


@config_app.command("show")
def config_show(name: str, region: RegionOption, as_json: JsonFlag = False) -> None:
    """One device configuration."""
    _act(
        build(ShowDeviceConfig, as_json, region=region, name=name),
        as_json,
        f"device configuration {name}",
    )


@config_app.command("remove")
def config_remove(name: str, region: RegionOption, as_json: JsonFlag = False) -> None:
    """Remove a configuration no device uses."""
    _act(
        build(RemoveDeviceConfig, as_json, region=region, name=name),
        as_json,
        f"device configuration {name} removed",
    )


# --- rollouts -------------------------------------------------------------------------------


@rollout_app.command("show")
def rollout_show(rollout_id: str, as_json: JsonFlag = False) -> None:
    """A rollout: its phase (and why it stopped), and each device's state with its reason."""
    reply = _act(
        build(ShowRollout, as_json, rollout_id=rollout_id), as_json, f"rollout {rollout_id}"
    )
    if not as_json:
        _rollout_devices(reply)


@rollout_app.command("cancel")
def rollout_cancel(rollout_id: str, as_json: JsonFlag = False) -> None:
    """Cancel a rollout at any stage: devices not told are never told, devices on their way
    go back to what they ran before."""
    reply = _act(
        build(CancelRollout, as_json, rollout_id=rollout_id), as_json, f"rollout {rollout_id}"
    )
    if not as_json:
        _rollout_devices(reply)


@rollout_app.command("list")
def rollout_list(
    limit: Annotated[int, typer.Option(help="newest first")] = 20, as_json: JsonFlag = False
) -> None:
    """Your rollouts, newest first."""
    reply = answer(build(ListRollouts, as_json, limit=limit), RolloutList, as_json)
    if as_json:
        return
    table = Table("Rollout", "Region", "Config", "Phase", "Devices", "Reason")
    for r in reply.rollouts:
        table.add_row(
            r.rollout_id,
            escape(r.region),
            escape(r.config),
            r.phase.value,
            str(len(r.devices)),
            escape(r.reason or ""),
        )
    render.out().print(table)
