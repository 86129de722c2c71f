# JupyterHub for a slotmap workshop on one machine: `jupyterhub -f workshop/jupyterhub_config.py`
# (workshop/README.md: from a fresh VM to a running workshop; slotmap-hub.service runs it).
#
# - Login: one shared workshop password for learners ($SLOTMAP_HUB_PASSWORD, 8+ characters);
#   the instructors ($SLOTMAP_HUB_ADMINS, default "instructor") log in with their own
#   ($SLOTMAP_HUB_ADMIN_PASSWORD, 32+ characters) and are the hub's admins.
# - Learners are system users the hub creates for the course on their first login, and only
#   those (slotmap.workshop.accounts): root, system accounts, reserved names and every account
#   the hub did not create are refused at the login page, which says why and what names are
#   allowed. The accounts it created are recorded in its state folder.
# - One JupyterLab per learner, started by `slotmap workshop learner-server` as that learner
#   (never as root): it copies the course into ~/slotmap-course on first login, brings files
#   the learner never changed up to date on later ones, and never touches my_work/ once it
#   exists. Idle kernels are shut down after $SLOTMAP_HUB_KERNEL_IDLE seconds (1800).
# - Each learner chooses English or 中文 when their server starts (the hub's form; the room's
#   default is $SLOTMAP_HUB_LANG, en or zh; their last choice is offered again): a server in
#   Chinese has the lessons, its own exercise copies (my_work/zh_CN) and JupyterLab's menus in
#   Chinese. The dashboard speaks $SLOTMAP_LANG, the hub's own (the instructor's language).
# - $SLOTMAP_HUB_HOMES (a path with {username}) instead runs every learner as the hub's own
#   user with that home (SimpleLocalProcessSpawner: no isolation between learners; for tests
#   as a non-root user only, never with a real room; as root it refuses to start learners).
# - Limits: under systemd, each learner's server is a systemd unit with MemoryMax and CPUQuota
#   (slotmap.workshop.limits: $SLOTMAP_HUB_MEM_LIMIT, $SLOTMAP_HUB_CPU_LIMIT); else none.
# - Services: the idle culler stops a server idle for $SLOTMAP_HUB_IDLE_TIMEOUT seconds (3600);
#   the dashboard (`slotmap workshop dashboard`, /services/workshop-dashboard/) is the
#   instructors' live view of the room, open to the admins only. It reads the learners'
#   progress files and the records their checks post to it ($SLOTMAP_HUB_DASHBOARD_SOURCES:
#   "files,posted", the default, "files" or "posted"); a learner's server token may post
#   their own records only (the custom scope custom:slotmap-records:write).
# - A hub restart keeps the learners' servers (cleanup_servers off): stop them from the admin
#   page, or they stop when idle.
# - Ports: $SLOTMAP_HUB_PORT (8000, the one learners open), and on loopback the hub's API
#   ($SLOTMAP_HUB_API_PORT, 8081), the proxy's API ($SLOTMAP_HUB_PROXY_API_PORT, 8001) and the
#   dashboard ($SLOTMAP_HUB_DASHBOARD_PORT, 8002).
# - The proxy: started by the hub, or with $SLOTMAP_HUB_PROXY=external run apart by
#   `slotmap workshop proxy` (slotmap-proxy.service), so that it outlives a hub restart.
# - State: $SLOTMAP_HUB_STATE (/var/lib/slotmap-hub), root's only (0700, files 0600): the
#   database, the cookie secret, the proxy's pid and the accounts the hub created.
import os
import sys
from pathlib import Path

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from jupyterhub.handlers.login import LoginHandler

from slotmap.exercises.progress import RECORDS_URL_VARIABLE
from slotmap.i18n import tr
from slotmap.workshop import accounts, language, limits, proxy, records, state_folder

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

COURSE = Path(__file__).resolve().parents[1]  # the checkout this file is in: what learners get
PYTHON = sys.executable  # the course's environment (.venv): the hub, learners and services
HOMES = os.environ.get("SLOTMAP_HUB_HOMES")  # unset: system users' homes
KERNEL_IDLE = int(os.environ.get("SLOTMAP_HUB_KERNEL_IDLE") or 1800)
ADMINS = {name for name in os.environ.get("SLOTMAP_HUB_ADMINS", "instructor").split(",") if name}
STATE = state_folder()
REGISTRY = accounts.Registry(STATE / accounts.REGISTRY_FILE)

# The hub's state is root's only: learners must not read the database (names, token hashes)
# or the cookie secret. Everything the hub writes from here on is private (umask), and a
# database made by an older setup is closed too.
os.umask(0o077)
STATE.mkdir(mode=0o700, parents=True, exist_ok=True)
os.chmod(STATE, 0o700)
for _state_file in STATE.iterdir():
    if _state_file.is_file() and not _state_file.is_symlink():
        os.chmod(_state_file, 0o600)
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
for _admin in ADMINS:
    if _problem := accounts.account_problem(_admin, REGISTRY, ADMINS):
        sys.exit(f"SLOTMAP_HUB_ADMINS: {_problem}")
try:
    ROOM_LANG = language.room_language()  # what the form offers a learner who never chose
except ValueError as _error:
    sys.exit(f"{language.ROOM_VARIABLE}: {_error}")


PORTS = proxy.Ports.from_environment()
c.JupyterHub.bind_url = f"http://{PORTS.ip}:{PORTS.public}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = PORTS.hub_api
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PORTS.proxy_api}"
if proxy.external():
    # slotmap-proxy.service runs the proxy (`slotmap workshop proxy`): it outlives a hub
    # restart, so learners' pages keep answering; both read CONFIGPROXY_AUTH_TOKEN.
    c.ConfigurableHTTPProxy.should_start = False
else:
    # `make hub` installs the proxy into the environment (npm, local prefix); else PATH's.
    c.ConfigurableHTTPProxy.command = [proxy.proxy_executable() or "configurable-http-proxy"]


# One shared password for the room; the instructors have their own and are the admins.
class CourseLoginHandler(LoginHandler):
    """The hub's login page, saying why a name is refused instead of "Invalid username or
    password" (the name's rules to anyone; that it is an account of the machine only after
    the right password)."""

    refusal = ""

    def _render(self, login_error=None, username=None, **kwargs):
        if login_error:
            typed = self.get_body_argument("username", default="")
            admin = self.authenticator.normalize_username(typed) in self.authenticator.admin_users
            rules = "" if admin else accounts.name_problem(typed)
            login_error = self.refusal or rules or login_error
            if self.refusal:
                self.set_status(403)
        return super()._render(login_error=login_error, username=username, **kwargs)


class CourseAuthenticator(SharedPasswordAuthenticator):
    """The shared password, for the names a learner may have on this machine only."""

    async def authenticate(self, handler, data):
        name = self.normalize_username(data.get("username", ""))
        problem = "" if name in self.admin_users else accounts.name_problem(name)
        # Admins are told apart by the lower-cased name ("INSTRUCTOR" is the instructor).
        authenticated = await super().authenticate(handler, {**data, "username": name})
        if problem or authenticated is None:
            return None
        problem = accounts.account_problem(name, REGISTRY, self.admin_users)
        if problem:
            self.log.warning("Refused login as %r: %s", name, problem)
            handler.refusal = problem
            return None
        return authenticated

    def validate_username(self, username):
        # Also what an admin may add on the admin page: never root or a reserved name.
        refused = username not in self.admin_users and accounts.name_problem(username)
        return super().validate_username(username) and not refused

    def check_allowed(self, username, authentication=None):
        if username not in self.admin_users and accounts.name_problem(username):
            return False
        return not accounts.account_problem(username, REGISTRY, self.admin_users)

    def get_handlers(self, app):
        return [("/login", CourseLoginHandler)]


c.JupyterHub.authenticator_class = CourseAuthenticator
c.SharedPasswordAuthenticator.user_password = os.environ.get("SLOTMAP_HUB_PASSWORD", "")
c.SharedPasswordAuthenticator.admin_password = os.environ.get("SLOTMAP_HUB_ADMIN_PASSWORD", "")
c.Authenticator.admin_users = ADMINS
c.Authenticator.allow_all = True  # anyone with the room's password gets their own server
# A learner's name becomes a system user's (accounts.NAME_RULES); the page says the rules.
c.Authenticator.username_pattern = accounts.NAME_PATTERN
c.JupyterHub.template_vars = {"announcement_login": tr(accounts.NAME_RULES).capitalize() + "."}

# Each learner's server: their course copy synced first, then jupyterhub-singleuser on it.
c.Spawner.cmd = [PYTHON, "-m", "slotmap", "workshop", "learner-server"]
c.Spawner.default_url = "/lab/tree/my_work"
c.Spawner.environment = {"SLOTMAP_COURSE_SOURCE": str(COURSE)}
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "SLOTMAP_BACKEND", "SLOTMAP_LAUNCH_POLICY"]
# Each learner chooses the course's language as their server starts; JupyterHub keeps the
# choice (its database) and the form offers it again. A start through the REST API without
# options reuses it too.
c.Spawner.options_form = lambda spawner: language.options_form(spawner.user_options, ROOM_LANG)
c.Spawner.options_from_form = language.options_from_form


def _speak_chosen_language(spawner, user_options) -> None:
    """The learner's server in their language: $SLOTMAP_LANG, and opening on their copies
    (a language the course does not have: the hub answers 400)."""
    lang = language.chosen_language(user_options, ROOM_LANG)
    environment, spawner.default_url = language.server_settings(lang, COURSE)
    spawner.environment = {**spawner.environment, **environment}


c.Spawner.apply_user_options = _speak_chosen_language


# The Jupyter server's own settings for the course: a kernel that ran nothing for
# $SLOTMAP_HUB_KERNEL_IDLE seconds is shut down, open tab or not (about 0.4 GB each; a cell
# re-run brings it back), and no news or update pop-ups over the learners' notebooks.
c.Spawner.args = [
    f"--MappingKernelManager.cull_idle_timeout={KERNEL_IDLE}",
    "--MappingKernelManager.cull_interval=60",
    "--MappingKernelManager.cull_connected=True",
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
]
# A hub restart (an upgrade, a crash, systemctl restart) keeps the learners' servers and
# kernels: the new hub finds them by their pids in its database.
c.JupyterHub.cleanup_servers = False
# A room logging in at once starts many servers at once (each imports torch): be patient.
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300

if HOMES:
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = HOMES
    WORKSPACES = str(Path(HOMES) / "slotmap-course" / "my_work")

    def _check_learner(spawner) -> None:
        """Refused names never get a server, whatever let them in."""
        name = spawner.user.name
        if name not in ADMINS and accounts.name_problem(name):
            raise PermissionError(accounts.name_problem(name))

    c.Spawner.pre_spawn_hook = _check_learner
else:
    c.JupyterHub.spawner_class = "localprocess"
    WORKSPACES = "/home/{username}/slotmap-course/my_work"

    def _create_learner(spawner) -> None:
        """The learner's system user, made and recorded on first login; never an account
        the hub did not create (the hub runs as root)."""
        accounts.prepare_account(spawner.user.name, REGISTRY, ADMINS)

    c.Spawner.pre_spawn_hook = _create_learner

# Under systemd each learner's server is the unit jupyter-<name>, with MemoryMax and CPUQuota
# ($SLOTMAP_HUB_MEM_LIMIT, $SLOTMAP_HUB_CPU_LIMIT); elsewhere the log says limits are off.
try:
    limits.configure(c, os.environ)
except ValueError as _bad_limit:
    sys.exit(str(_bad_limit))

# The services run as the hub's user (root on a VM: the dashboard reads every learner's home).
DASHBOARD = "workshop-dashboard"
SOURCES = set(os.environ.get("SLOTMAP_HUB_DASHBOARD_SOURCES", "files,posted").split(","))
if not SOURCES or not SOURCES <= {"files", "posted"}:
    sys.exit("SLOTMAP_HUB_DASHBOARD_SOURCES: files, posted or files,posted")
DASHBOARD_ENVIRONMENT = {
    "SLOTMAP_COURSE_SOURCE": str(COURSE),
    # The room in the instructor's language: the hub's own, not a learner's choice.
    "SLOTMAP_LANG": os.environ.get("SLOTMAP_LANG", ""),
}
if "files" in SOURCES:
    DASHBOARD_ENVIRONMENT["SLOTMAP_HUB_WORKSPACES"] = WORKSPACES
if "posted" in SOURCES:
    # The records learners post: a folder of the dashboard's own, root's like the state.
    DASHBOARD_ENVIRONMENT[records.STORE_VARIABLE] = str(STATE / "dashboard-records")
    # Each check also posts its record there, from the learner's kernel, with their server's
    # token (JupyterHub puts $JUPYTERHUB_API_TOKEN in the server's environment, and the
    # kernels inherit it); the dashboard answers on loopback, where the kernels run.
    c.Spawner.environment[RECORDS_URL_VARIABLE] = (
        f"http://127.0.0.1:{PORTS.dashboard}/services/{DASHBOARD}/{records.RECORDS_PATH}"
    )
# Who may post records: each user for themselves (the "user" role's "self", plus the custom
# scope), and their server's token with them: the server role's two scopes, plus it.
c.JupyterHub.custom_scopes = {
    records.RECORDS_SCOPE: {"description": "Post one's own check records to the room's dashboard"}
}
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    records.RECORDS_SCOPE,
]
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
        "url": f"http://127.0.0.1:{PORTS.dashboard}",
        "command": [PYTHON, "-m", "slotmap", "workshop", "dashboard"],
        "environment": DASHBOARD_ENVIRONMENT,
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
    {"name": "user", "scopes": ["self", records.RECORDS_SCOPE]},
]
# Who may open the dashboard: the admins only (their role holds access:services); learners'
# role ("user": their own things) does not, so the hub answers them 403.
