# JupyterHub for a slotmap workshop on one machine: `jupyterhub -f workshop/jupyterhub_config.py`
# (workshop/README.md: from a fresh VM to a running workshop).
#
# - Login: one shared workshop password for learners ($SLOTMAP_HUB_PASSWORD, 8+ characters);
#   the instructors ($SLOTMAP_HUB_ADMINS, default "instructor") log in with their own
#   ($SLOTMAP_HUB_ADMIN_PASSWORD, 32+ characters) and are the hub's admins.
# - One JupyterLab per learner, started by `slotmap workshop learner-server` as that learner:
#   it copies the course into ~/slotmap-course on first login, brings files the learner never
#   changed up to date on later ones, and never touches my_work/ once it exists.
# - Learners are system users, created on first login (LocalProcessSpawner, the hub as root),
#   so no learner can read another's home. $SLOTMAP_HUB_HOMES (a path with {username}) instead
#   runs every learner as the hub's own user with that home (SimpleLocalProcessSpawner: no
#   isolation between learners; the end-to-end test uses it, never use it with a real room).
# - Services: the idle culler stops a server idle for $SLOTMAP_HUB_IDLE_TIMEOUT seconds (3600);
#   the dashboard (`slotmap workshop dashboard`, /services/workshop-dashboard/) is the
#   instructors' live view of the room, open to the admins only.
# - Ports: $SLOTMAP_HUB_PORT (8000, the one learners open), and on loopback the hub's API
#   ($SLOTMAP_HUB_API_PORT, 8081), the proxy's API ($SLOTMAP_HUB_PROXY_API_PORT, 8001) and the
#   dashboard ($SLOTMAP_HUB_DASHBOARD_PORT, 8002). The hub's database and cookie secret go in
#   the folder it starts in.
import os
import pwd
import subprocess
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

COURSE = Path(__file__).resolve().parents[1]  # the checkout this file is in: what learners get
PYTHON = sys.executable  # the course's environment (.venv): the hub, learners and services
HOMES = os.environ.get("SLOTMAP_HUB_HOMES")  # unset: system users' homes
ADMINS = {name for name in os.environ.get("SLOTMAP_HUB_ADMINS", "instructor").split(",") if name}


def _port(variable: str, default: int) -> int:
    return int(os.environ.get(variable) or default)


c.JupyterHub.bind_url = (
    f"http://{os.environ.get('SLOTMAP_HUB_IP', '')}:{_port('SLOTMAP_HUB_PORT', 8000)}"
)
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = _port("SLOTMAP_HUB_API_PORT", 8081)
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{_port('SLOTMAP_HUB_PROXY_API_PORT', 8001)}"
# `make hub` installs the proxy into the environment (npm, local prefix); else it is on PATH.
_proxy = (
    Path(PYTHON).parents[1] / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
)
c.ConfigurableHTTPProxy.command = [str(_proxy) if _proxy.exists() else "configurable-http-proxy"]

# One shared password for the room; the instructors have their own and are the admins.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ.get("SLOTMAP_HUB_PASSWORD", "")
c.SharedPasswordAuthenticator.admin_password = os.environ.get("SLOTMAP_HUB_ADMIN_PASSWORD", "")
c.Authenticator.admin_users = ADMINS
c.Authenticator.allow_all = True  # anyone with the room's password gets their own server
# A learner's name becomes a system user's: lower-case letters and digits only.
c.Authenticator.username_pattern = r"^[a-z][a-z0-9]{0,30}$"

# Each learner's server: their course copy synced first, then jupyterhub-singleuser on it.
c.Spawner.cmd = [PYTHON, "-m", "slotmap", "workshop", "learner-server"]
c.Spawner.default_url = "/lab/tree/my_work"
c.Spawner.environment = {"SLOTMAP_COURSE_SOURCE": str(COURSE)}
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "SLOTMAP_BACKEND", "SLOTMAP_LAUNCH_POLICY"]
# A room logging in at once starts many servers at once (each imports torch): be patient.
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300

if HOMES:
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = HOMES
    WORKSPACES = str(Path(HOMES) / "slotmap-course" / "my_work")
else:
    c.JupyterHub.spawner_class = "localprocess"
    WORKSPACES = "/home/{username}/slotmap-course/my_work"

    def _create_learner(spawner) -> None:
        """A learner's system user, made on first login (the hub runs as root)."""
        name = spawner.user.name
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
            os.chmod(pwd.getpwnam(name).pw_dir, 0o700)  # no learner reads another's work

    c.Spawner.pre_spawn_hook = _create_learner

# The services run as the hub's user (root on a VM: the dashboard reads every learner's home).
DASHBOARD = "workshop-dashboard"
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            PYTHON,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={int(os.environ.get('SLOTMAP_HUB_IDLE_TIMEOUT') or 3600)}",
        ],
    },
    {
        "name": DASHBOARD,
        "url": f"http://127.0.0.1:{_port('SLOTMAP_HUB_DASHBOARD_PORT', 8002)}",
        "command": [PYTHON, "-m", "slotmap", "workshop", "dashboard"],
        "environment": {
            "SLOTMAP_HUB_WORKSPACES": WORKSPACES,
            "SLOTMAP_COURSE_SOURCE": str(COURSE),
        },
        "oauth_no_confirm": True,
        "display": True,
    },
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    },
    # The dashboard reads who the users are, which are admins and when they were last active.
    {"name": DASHBOARD, "scopes": ["list:users", "read:users"], "services": [DASHBOARD]},
]
# Who may open the dashboard: the admins only (their role holds access:services); learners'
# role ("user": their own things) does not, so the hub answers them 403.
