import os
import secrets

import pytest


@pytest.fixture
def name():
    """A channel name of this test alone; the test fails if anything of that name is left
    in /dev/shm afterwards (channels and their pools go with their last user)."""
    n = "gpuring-pytest-%d-%s" % (os.getpid(), secrets.token_hex(4))
    yield n
    import gc

    gc.collect()
    left = [f for f in os.listdir("/dev/shm") if n in f]
    assert not left, "left in /dev/shm: %r" % left
