"""A job's identity: the cluster it is in, its namespace and its name (`JobKey`).

Its text is the job's key in the table and in messages, unchanged since clusters came: `namespace/name`,
prefixed `<cluster>:` when the job is in a registered cluster (`prewarm.domain.clusters`). The key is a
`str` of that text, so every table, queue and log line reads it as before; code that needs the cluster,
namespace or name asks the key, never parses the text. The text is parsed once, where a key comes in as
text (`JobKey.parse`: a stored item, a person's argument).
"""

from __future__ import annotations

from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped, split_scoped


class JobKey(str):
    """`JobKey("ml", "web")` is `ml/web`; `JobKey("ml", "web", "prod-eu")` is `prod-eu:ml/web`.

    >>> key = JobKey("ml", "web", "prod-eu")
    >>> key, key.cluster, key.namespace, key.name
    ('prod-eu:ml/web', 'prod-eu', 'ml', 'web')
    """

    cluster: str
    namespace: str
    name: str

    def __new__(cls, namespace: str, name: str, cluster: str = DEFAULT_CLUSTER) -> JobKey:
        key = super().__new__(cls, scoped(cluster, f"{namespace}/{name}"))
        key.cluster, key.namespace, key.name = cluster, namespace, name
        return key

    @classmethod
    def parse(cls, text: str) -> JobKey:
        """The key whose text is `text` (a stored item's, a person's); `ValueError` when it names no job.

        >>> JobKey.parse("ml/web") == JobKey("ml", "web"), JobKey.parse("prod-eu:ml/web").cluster
        (True, 'prod-eu')
        """
        if isinstance(text, JobKey):
            return text
        cluster, local = split_scoped(text)
        namespace, separator, name = local.partition("/")
        if not (namespace and separator and name):
            raise ValueError(f"{text!r} is not a job key: [<cluster>:]<namespace>/<name>")
        return cls(namespace, name, cluster)

    def sibling(self, name: str) -> JobKey:
        """The key of another job of this key's namespace and cluster."""
        return JobKey(self.namespace, name, self.cluster)

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles keep the parts
        return JobKey, (self.namespace, self.name, self.cluster)
