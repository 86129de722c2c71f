"""workshop/values.yaml, the Kubernetes path, without a cluster: it passes the jupyterhub Helm
chart's own JSON schema (merged onto the chart's defaults, as helm validates it), its
placeholder passwords refuse to start (JupyterHub's own validation, and its extraConfig by
name), it asks for TLS, and the README pins the chart version the schema comes from."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "workshop" / "values.yaml"
CHART = next((ROOT / "tests" / "data").glob("z2jh-*"))
CHART_VERSION = CHART.name.removeprefix("z2jh-")


def _merged(defaults: dict, values: dict) -> dict:
    """``values`` over ``defaults`` as helm merges them: maps key by key, anything else
    replaced, a null removing the key."""
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _validate(values: dict) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(_merged(defaults, values))


@pytest.fixture
def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def test_the_values_pass_the_charts_own_schema(values):
    _validate(values)


@pytest.mark.parametrize(
    "wrong",
    [
        {"singleuser": {"memory": {"limt": "3G"}}},  # a typo
        {"proxy": {"https": {"enabled": "yes"}}},  # a wrong type
        {"cull": {"timeout": "an hour"}},
    ],
    ids=["typo", "type", "cull-timeout"],
)
def test_the_schema_check_refuses_what_helm_would(values, wrong):
    with pytest.raises(jsonschema.ValidationError):
        _validate(_merged(values, wrong))


def _hub_config(values: dict) -> Config:
    """``c`` as the chart's jupyterhub_config.py builds it from hub.config."""
    c = Config()
    for section, settings in values["hub"]["config"].items():
        c[section].update(settings)
    return c


def test_the_placeholder_passwords_refuse_to_start(values):
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator

    shared = values["hub"]["config"]["SharedPasswordAuthenticator"]
    for name in ("user_password", "admin_password"):
        with pytest.raises(ValueError, match=f"{name} must be at least"):
            SharedPasswordAuthenticator(**{name: shared[name]})
    # And by name, whatever their length: the chart runs extraConfig after hub.config.
    (snippet,) = values["hub"]["extraConfig"].values()
    c = _hub_config(values)
    with pytest.raises(SystemExit, match="user_password is still the placeholder"):
        exec(snippet, {"c": c})
    values["hub"]["config"]["SharedPasswordAuthenticator"] = {
        "user_password": "REPLACE-but-long-enough",
        "admin_password": "a" * 40,
    }
    with pytest.raises(SystemExit, match="user_password is still the placeholder"):
        exec(snippet, {"c": _hub_config(values)})
    values["hub"]["config"]["SharedPasswordAuthenticator"] = {
        "user_password": "the-room-password",
        "admin_password": "b" * 40,
    }
    exec(snippet, {"c": _hub_config(values)})  # real passwords start


def test_tls_is_on_and_the_memory_is_the_measured_one(values):
    https = values["proxy"]["https"]
    assert https["enabled"] is True and https["hosts"] and https["letsencrypt"]["contactEmail"]
    memory = values["singleuser"]["memory"]
    assert (memory["guarantee"], memory["limit"]) == ("1G", "3G")


def test_the_readme_and_the_values_pin_the_chart_the_schema_comes_from():
    readme = (ROOT / "workshop" / "README.md").read_text(encoding="utf-8")
    header = VALUES.read_text()
    for text in (readme, header):
        assert "helm repo add jupyterhub https://hub.jupyter.org/helm-chart/" in text
        pins = re.findall(r"jupyterhub/jupyterhub --version (\S+)", text)
        assert pins and set(pins) == {CHART_VERSION}


def test_the_records_scope_and_address_are_wired_both_ends(values):
    """The learners' checks post where the dashboard listens, with a token that holds the
    scope the dashboard asks for: one custom scope, one service name, one port, one image."""
    from urllib.parse import urlparse

    from jupyterhub import roles, scopes

    from slotmap.exercises.progress import RECORDS_URL_VARIABLE
    from slotmap.workshop.records import RECORDS_PATH, RECORDS_SCOPE, STORE_VARIABLE

    hub, singleuser = values["hub"], values["singleuser"]
    config = hub["config"]
    # The hub knows the scope (JupyterHub's own check of its definition), the users hold it,
    # and their servers' tokens ask for it on top of the chart's server role.
    scopes.define_custom_scopes(config["JupyterHub"]["custom_scopes"])
    assert list(config["JupyterHub"]["custom_scopes"]) == [RECORDS_SCOPE]
    assert hub["loadRoles"]["user"]["scopes"] == ["self", RECORDS_SCOPE]
    server_role = next(r for r in roles.get_default_roles() if r["name"] == "server")
    asked = config["KubeSpawner"]["server_token_scopes"]
    assert asked == [*server_role["scopes"], RECORDS_SCOPE]
    scopes._check_scopes_exist(asked)

    # The service, its role, its sidecar: the same name everywhere.
    (name,) = hub["services"]
    assert hub["loadRoles"][name]["services"] == [name]
    (container,) = hub["extraContainers"]
    env = {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
    assert env["JUPYTERHUB_SERVICE_NAME"] == name
    assert env["JUPYTERHUB_CLIENT_ID"] == f"service-{name}"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == f"/services/{name}/"
    assert env["JUPYTERHUB_OAUTH_CALLBACK_URL"] == f"/services/{name}/oauth_callback"
    key = env["JUPYTERHUB_API_TOKEN"]["secretKeyRef"]
    assert key == {"name": "hub", "key": f"hub.services.{name}.apiToken"}  # the chart's own
    assert container["command"] == ["python", "-m", "slotmap", "workshop", "dashboard"]
    image = singleuser["image"]
    assert container["image"] == f"{image['name']}:{image['tag']}"  # slotmap is in it
    (mount,) = container["volumeMounts"]
    assert env[STORE_VARIABLE].startswith(mount["mountPath"] + "/")

    # The learners post to the address the proxy routes the service to, on its port, through
    # the network policies of both ends.
    service = urlparse(hub["services"][name]["url"])
    port = urlparse(env["JUPYTERHUB_SERVICE_URL"]).port
    assert service.port == port and service.hostname == "hub"  # the chart's hub Service
    assert [p["port"] for p in hub["service"]["extraPorts"]] == [port]
    posted = urlparse(singleuser["extraEnv"][RECORDS_URL_VARIABLE])
    assert (posted.hostname, posted.port) == (service.hostname, service.port)
    assert posted.path == f"/services/{name}/{RECORDS_PATH}"
    (ingress,) = hub["networkPolicy"]["ingress"]
    (egress,) = singleuser["networkPolicy"]["egress"]
    assert ingress["ports"] == egress["ports"] == [{"port": port}]
    assert egress["to"][0]["podSelector"]["matchLabels"] == {"component": "hub"}
