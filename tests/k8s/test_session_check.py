"""The session's own check that no process outlives it sees a leftover process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.k8s


# -- no process outlives the session -------------------------------------------------------------------------------

def test_the_session_check_sees_a_leftover_process():
    """The session-scoped check (conftest.no_process_outlives_the_session) finds every process the session started,
    however it was detached (its own session, reparented to init): they carry the session's mark."""
    import os
    import subprocess
    import sys
    import time

    from tests.k8s.conftest import SESSION_MARK, marked_processes

    mark = os.environ[SESSION_MARK]
    # a grandchild that outlives its parent: reparented to init, the usual leak
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                                          "'import time; time.sleep(60)'], start_new_session=True)"], check=True)
    time.sleep(0.5)
    left = [(pid, cmd) for pid, cmd in marked_processes(mark) if "time.sleep(60)" in cmd]
    assert len(left) == 1, marked_processes(mark)
    os.kill(left[0][0], 9)
    time.sleep(0.2)
    assert not [p for p in marked_processes(mark) if "time.sleep(60)" in p[1]]
