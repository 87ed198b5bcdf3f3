"""Which creates a pool answers: the same image and resources, or the same template and the resources
that either side names (the rest are the template's)."""

from __future__ import annotations

import pytest

from stasis.models import CreateSandboxRequest as Create
from stasis.netpolicy import NetworkPolicy
from stasis.pool_models import CreatePoolRequest as Pool

pytestmark = pytest.mark.fast


def test_an_image_pool_answers_its_exact_spec_only() -> None:
    pool = Pool(name="p", image="default", memory_mb=512)
    assert pool.matches(Create(memory_mb=512, name="mine", timeout_secs=60, on_idle="terminate"))
    assert not pool.matches(Create())  # the default 1024 MiB is not what the pool has
    assert not pool.matches(Create(memory_mb=512, image="other"))
    assert not pool.matches(Create(memory_mb=512, cpus=2))
    assert not pool.matches(Create(memory_mb=512, network=NetworkPolicy()))  # its kernel has no network device
    assert not pool.matches(Create(memory_mb=512, snapshot_id="ck-1"))
    assert not pool.matches(Create(memory_mb=512, template="t"))


def test_a_template_pool_answers_its_template_and_the_resources_either_names() -> None:
    pool = Pool(name="p", template="notebook")
    assert pool.matches(Create(template="notebook", name="nb"))
    assert not pool.matches(Create(template="other"))
    assert not pool.matches(Create(template="notebook", cpus=2))  # the pool's members have the template's
    assert not pool.matches(Create())
    sized = Pool(name="p", template="notebook", cpus=2)
    assert sized.matches(Create(template="notebook", cpus=2))
    assert not sized.matches(Create(template="notebook"))
    request = sized.member_request()
    assert (request.template, request.cpus, request.timeout_secs) == ("notebook", 2, None)
    assert "memory_mb" not in request.model_fields_set  # the template's memory, which a restore must keep
