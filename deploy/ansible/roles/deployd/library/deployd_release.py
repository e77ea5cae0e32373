#!/usr/bin/python3
# -*- coding: utf-8 -*-
# Part of deployd's Ansible role: deploy or roll back a release with the
# deployd CLI on the host and report what the agent did.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: deployd_release
short_description: Deploy a release of an app with deployd, or roll it back
description:
  - Runs C(deployd deploy APP --artifact PATH --json) (or C(deployd rollback APP --json)) on the
    host and reads the agent's result, the last line of its --json output.
  - C(changed) only when a new release went live (status C(deployed) or C(rolled-back)); a
    deploy of the version already current, or a rollback to the current release, changes nothing.
  - Fails, with the agent's reason, the new workers' (or the before hook's) last output and the
    whole result, when the release was refused or abandoned; the previous release keeps serving.
options:
  app: {description: The app (an [apps.NAME] with releases = true)., required: true, type: str}
  state:
    description: C(deployed) deploys I(artifact); C(rolled_back) rolls back to I(to) or the previous release.
    choices: [deployed, rolled_back]
    default: deployed
    type: str
  artifact: {description: The artifact on the host (an executable, a .tar.gz or a folder)., type: path}
  version: {description: "The release name (default: deployd's, the first 12 hex digits of its sha256).", type: str, default: ""}
  sha256: {description: The artifact's expected sha256, checked by the agent., type: str, default: ""}
  to: {description: "rolled_back: the release to go to (default: the previous one, which is not idempotent).", type: str, default: ""}
  strategy: {description: rolling or blue-green., type: str, default: rolling}
  timeout: {description: "Give up waiting after this (e.g. 10m); the agent goes on.", type: str, default: ""}
  config: {description: The agent's config (for its socket)., type: path, default: /etc/deployd/deployd.toml}
  binary: {description: The deployd CLI., type: path, default: deployd}
"""

RETURN = r"""
status: {description: "deployed, rolled-back, unchanged, failed or refused.", type: str, returned: always}
version: {description: The release the app was moved to (or was asked to)., type: str, returned: always}
previous: {description: The release that served before., type: str, returned: always}
result: {description: "The agent's whole result: app, version, previous, status, duration_seconds, error, exit_status, last_lines, hooks.", type: dict, returned: when the agent answered}
events: {description: The progress events of the operation., type: list, returned: when the agent answered}
started: {description: When the operation started (Unix time, seconds)., type: float, returned: always}
finished: {description: When it ended (Unix time, seconds)., type: float, returned: always}
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule

LIVE = ("deployed", "rolled-back")


def parse_lines(stdout):
    """The JSON lines of a --json run: events first, the result last."""
    lines = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return lines


def current_release(module, base):
    """The app's current release on this host, "" when none."""
    rc, out, err = module.run_command(base("releases") + ["--json"])
    if rc != 0:
        module.fail_json(msg="deployd releases %s: exit %d: %s" % (module.params["app"], rc, (err or out).strip()))
    for rel in json.loads(out).get("releases", []):
        if rel.get("status") == "current":
            return rel.get("version", "")
    return ""


def command(module, base):
    p = module.params
    if p["state"] == "deployed":
        if not p["artifact"]:
            module.fail_json(msg="state=deployed needs artifact (the artifact's path on the host)")
        argv = base("deploy") + ["--artifact", p["artifact"]]
        if p["version"]:
            argv += ["--version", p["version"]]
        if p["sha256"]:
            argv += ["--sha256", p["sha256"]]
    else:
        argv = base("rollback")
        if p["to"]:
            argv += ["--to", p["to"]]
    argv += ["--json", "--strategy", p["strategy"]]
    if p["timeout"]:
        argv += ["--timeout", p["timeout"]]
    return argv


def main():
    module = AnsibleModule(
        argument_spec=dict(
            app=dict(type="str", required=True),
            state=dict(type="str", default="deployed", choices=["deployed", "rolled_back"]),
            artifact=dict(type="path"),
            version=dict(type="str", default=""),
            sha256=dict(type="str", default=""),
            to=dict(type="str", default=""),
            strategy=dict(type="str", default="rolling"),
            timeout=dict(type="str", default=""),
            config=dict(type="path", default="/etc/deployd/deployd.toml"),
            binary=dict(type="path", default="deployd"),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def base(verb):
        argv = [p["binary"], verb]
        if verb != "version":
            argv.append(p["app"])
        return argv + ["-c", p["config"]]

    started = time.time()
    want = p["version"] if p["state"] == "deployed" else p["to"]
    if want and (module.check_mode or p["state"] == "rolled_back"):
        cur = current_release(module, base)
        if cur == want:
            module.exit_json(changed=False, status="unchanged", version=want, previous=cur,
                             started=started, finished=time.time())
    if module.check_mode:
        module.exit_json(changed=True, status="would " + ("deploy" if p["state"] == "deployed" else "roll back"),
                         version=want, previous="", started=started, finished=time.time())

    argv = command(module, base)
    rc, out, err = module.run_command(argv)
    finished = time.time()
    lines = parse_lines(out)
    res = lines[-1] if lines and "status" in lines[-1] else None
    if res is None:
        # Refused before the operation started (bad input, unknown app, another
        # operation running, agent unreachable): deployd said why on stderr.
        module.fail_json(msg="%s: exit %d: %s" % (" ".join(argv[:3]), rc, (err or out).strip()),
                         rc=rc, stderr=err, stdout=out, started=started, finished=finished)
    ret = dict(status=res.get("status", ""), version=res.get("version", ""), previous=res.get("previous", ""),
               result=res, events=lines[:-1], rc=rc, started=started, finished=finished)
    if rc != 0 or res.get("status") not in LIVE + ("unchanged",):
        msg = "%s %s of %s %s: %s" % (p["app"], "deploy" if p["state"] == "deployed" else "rollback",
                                      res.get("version", want), res.get("status", "failed"), res.get("error", err.strip()))
        for line in res.get("last_lines") or []:
            msg += "\n  | " + line
        module.fail_json(msg=msg, **ret)
    warnings = [h.get("error", "") + "; the release serves" for h in res.get("hooks") or [] if not h.get("ok")]
    for w in warnings:
        module.warn(w)
    module.exit_json(changed=res.get("status") in LIVE, **ret)


if __name__ == "__main__":
    main()
