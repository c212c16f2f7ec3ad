"""Local mode and test infrastructure: the whole system on one machine."""

from prewarm_devtools.project import ProjectFiles, ProjectFilesError, project_files

__all__ = ["ProjectFiles", "ProjectFilesError", "project_files"]
