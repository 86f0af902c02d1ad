"""Fixtures of the unilab tests."""

import mujoco
import pytest
from unilab_models import ARM_XML


@pytest.fixture(scope="session")
def arm_model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(ARM_XML)
