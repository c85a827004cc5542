"""The compensations package's public surface is pinned: a removed or renamed name fails here."""

import compensations

EXPECTED = {
    "DEFAULT_COMPENSATION_POLICY", "BreakerConfig", "BreakerConfigError", "BreakerRegistry", "BreakerStateError",
    "CompensationDefinitionError", "CompensationPlan", "CompensationPolicy", "Compensations", "CompensationsError",
    "EffectRecord", "PlanError", "PlannedCompensation", "declare_breaker", "default_breakers", "plan_compensations",
    "resolve_check", "resolve_compensation",
}
#: the breaker machine is a module of its own, for the engine (not the package's surface)
MACHINE = {"CLOSED", "OPEN", "HALF_OPEN", "BreakerState", "Decision", "Recorded", "decide", "record"}


def test_exported_names():
    assert set(compensations.__all__) == EXPECTED
    for name in compensations.__all__:
        assert hasattr(compensations, name), name


def test_the_breaker_machine_exports_its_pure_functions():
    from compensations import breaker_machine

    assert set(breaker_machine.__all__) == MACHINE


def test_the_package_imports_nothing_with_io():
    # Pure: nothing of the store or the orchestrator is imported by compensations
    import subprocess
    import sys

    code = ("import sys, compensations; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('store', 'orchestrator', 'httpx', 'sqlalchemy')]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
