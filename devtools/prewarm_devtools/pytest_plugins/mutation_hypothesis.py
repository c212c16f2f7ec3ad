"""Hypothesis settings for mutation testing (`make mutate` loads this plugin with `-p`; other runs never do).

Each mutant must be caught or not on every run: examples are derandomised, and no example fails for
taking longer than Hypothesis' 200 ms deadline, which a loaded machine would turn into false catches.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "mutation", derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("mutation")
