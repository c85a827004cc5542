"""The Orchestrator's own options: a value it could not keep its promises with is refused when it is
built, naming the option (a ConfigurationError), before anything is opened or written."""

from __future__ import annotations

import math

import pytest

from orchestrator import Orchestrator
from orchestrator.errors import ConfigurationError


@pytest.mark.parametrize("options, said", [
    ({"lease_ttl": math.nan}, "lease_ttl must be a positive, finite number of seconds, got nan"),
    ({"lease_ttl": math.inf}, "lease_ttl must be a positive, finite number of seconds, got inf"),
    ({"lease_ttl": 0}, "lease_ttl must be a positive, finite number of seconds, got 0"),
    ({"heartbeat": math.inf}, "heartbeat must be a positive, finite number of seconds, got inf"),
    ({"store_options": {"busy_timout": 5}}, "store_options: unknown option(s) 'busy_timout'; known: busy_timeout"),
    ({"store_options": {"busy_timeout": math.inf}},
     "store_options: busy_timeout must be a finite number of seconds >= 0, not inf"),
    ({"store_options": {"sqlite_synchronous": "SOMETIMES"}},
     "store_options: sqlite_synchronous must be one of OFF, NORMAL, FULL, EXTRA, not 'SOMETIMES'"),
])
def test_an_option_the_orchestrator_could_not_keep_its_promises_with_is_refused_naming_it(tmp_path, options, said):
    # Given a database path nobody has opened
    db = tmp_path / "never.db"
    # When an Orchestrator is built with the option / Then it is refused, naming the option, and no
    # database was made (a lease that never expires could not be taken over after a crash)
    with pytest.raises(ConfigurationError) as info:
        Orchestrator(f"sqlite:///{db}", **options)
    assert said in str(info.value)
    assert not db.exists()
