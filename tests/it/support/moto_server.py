"""moto_server for the e2e tests, with four emulator bugs worked around (tests/it/support/moto.rs).

The first two stop a launch template version change from being rolled against moto 5.2.5; AWS has
neither. The patches are applied in memory to moto's classes, then moto's own server entry point
runs with the arguments given; the installed package is left as pip installed it.

1. CreateLaunchTemplate parses the base64 UserData into a Base64EncodedString, but
   CreateLaunchTemplateVersion stores the raw request string. Every launch from such a version
   (RunInstances, an Auto Scaling group on `$Latest`, SetDesiredCapacity, the replacement after
   TerminateInstanceInAutoScalingGroup) then fails the assertion in
   LaunchTemplateVersion.user_data: HTTP 500. The assertion came with getmoto/moto#9510 ("adding
   assertion to help find any UserData ingress that might've been missed"); this ingress was
   missed. The patch parses a version's UserData the way version 1's is parsed (same type, same
   InvalidUserData.Malformed error for bad base64).

2. An Auto Scaling group launches with its template's id but without the version, so the
   AWS-managed tag `aws:ec2launchtemplate:version` on the instance, and the version its group
   lists for it, name the template's default version, not the version the instance was launched
   from (its image, type and user data do come from the group's version). A group on `$Latest`
   after a new version would have its new instances look old forever. The patch tags each new
   group instance with the version it was launched from and lists that version for it.

3. DescribeLaunchTemplates lists a template's tags as they were when it was created (the model
   copies them then); a later CreateTags shows in DescribeTags and in tag filters, but not in
   the list. kprov tags a template with each version it writes so that a preview need not read
   an unchanged template's version: against unpatched moto every template kprov changed after
   creating it would be read at every preview. The patch lists the template's current tags.

4. A subnet hands out private addresses from one cached generator (`Subnet._base_avail_ip_iterator`
   is `@cache`d), read without a lock on the threaded server: two launches into one subnet at
   once (two Auto Scaling groups of a cluster, created concurrently) can call it together, and
   the second fails inside moto with "ValueError: generator already executing", answered as an
   empty 500 that no SDK can parse (seen once in an aws_lifecycle run under load; reproduced
   with threads in-process). AWS assigns addresses atomically. The patch takes one lock around
   the subnet's address allocation.

Only the test harness runs this: kprov talks to any EC2 endpoint unchanged. Remove a patch when a
moto release fixes its bug (check by deleting it and running `cargo test --test it
aws_rolling_image`).

Usage: python3 moto_server.py [moto_server arguments], e.g. -H 127.0.0.1 -p 5000.
       python3 moto_server.py --serial HOST PORT (one request at a time; see moto.rs).
"""

import sys
import threading

from moto.autoscaling.models import FakeAutoScalingGroup, InstanceState
from moto.core.types import Base64EncodedString
from moto.ec2.models.launch_templates import LaunchTemplate
from moto.ec2.models.subnets import Subnet
from moto.ec2.utils import parse_user_data

_create_version = LaunchTemplate.create_version


def _create_version_parsed(self, data, description):
    # Version 1 (CreateLaunchTemplate, CloudFormation) arrives parsed already.
    user_data = data.get("UserData")
    if user_data is not None and not isinstance(user_data, Base64EncodedString):
        data = dict(data, UserData=parse_user_data(user_data))
    return _create_version(self, data, description)


LaunchTemplate.create_version = _create_version_parsed

_replace_instances = FakeAutoScalingGroup.replace_autoscaling_group_instances


def _replace_instances_versioned(self, count_needed, propagated_tags):
    before = len(self.instance_states)
    _replace_instances(self, count_needed, propagated_tags)
    if self.ec2_launch_template is None:
        return
    # The group resolved its version (`$Latest`, `$Default` or a number) for the launch.
    number = self.ec2_launch_template.get_version(self.launch_template_version).number
    for state in self.instance_states[before:]:
        state.instance.launched_template_version = number
        state.instance.add_tags({"aws:ec2launchtemplate:version": str(number)})


FakeAutoScalingGroup.replace_autoscaling_group_instances = _replace_instances_versioned

_listed_template = InstanceState.launch_template.fget


def _listed_template_versioned(self):
    lt = _listed_template(self)
    number = getattr(self.instance, "launched_template_version", None)
    if lt is not None and number is not None:
        lt = dict(lt, Version=number)
    return lt


InstanceState.launch_template = property(_listed_template_versioned)

# The copy __init__ assigns is dropped; the list reads the tags as they are.
LaunchTemplate.tags = property(lambda self: self.get_tags(), lambda self, _copy: None)

_subnet_ip = Subnet.get_available_subnet_ip
_subnet_ip_lock = threading.Lock()


def _subnet_ip_locked(self, instance):
    with _subnet_ip_lock:
        return _subnet_ip(self, instance)


Subnet.get_available_subnet_ip = _subnet_ip_locked


def serve_serial(host, port):
    from werkzeug.serving import run_simple

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    run_simple(
        host,
        port,
        DomainDispatcherApplication(create_backend_app),
        threaded=False,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serial"]:
        serve_serial(sys.argv[2], int(sys.argv[3]))
    else:
        from moto.server import main

        sys.exit(main(sys.argv[1:]))
