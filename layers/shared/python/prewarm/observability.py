"""The one place that owns the functions' Logger, Metrics and Tracer (Powertools).

Services log through the standard library (`logging.getLogger(__name__)`); their records are
formatted by the Powertools logger so every line is JSON with the job and node correlation keys.
"""

from __future__ import annotations

import logging
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

# A run that had nothing to count (an ignored event) is normal, not worth a warning per invocation.
warnings.filterwarnings("ignore", message="No application metrics to publish")

# Each handler starts its invocation with `inject_lambda_context(clear_state=True)`: no key one invocation
# appends (a job, an image) reaches the next one's lines. The logger's name is one of the Logger's own keys,
# so that clearing keeps it (the copy below appends it, and appended keys are what clearing forgets).
logger = Logger(name="%(name)s")
metrics = Metrics()
# Only boto3's calls become subsegments. Patching everything X-Ray knows (its default) imports
# requests and a dozen other libraries the functions never use: about 120 ms of every cold start.
# The Kubernetes client's calls show inside the handler's segment, not as subsegments of their own.
tracer = Tracer(patch_modules=("botocore",))

# The copy configures registered loggers only: a function whose service modules are not imported yet
# (all of them: bootstrap imports lazily) left "prewarm" unconfigured, and its services' lines went to
# the runtime's root handler as plain text, without the correlation keys.
logging.getLogger("prewarm")
copy_config_to_registered_loggers(source_logger=logger, include={"prewarm"})
