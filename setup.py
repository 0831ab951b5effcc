"""Build hook: declares only the perf dlfilter shared object (metadata is in pyproject.toml)."""

from setuptools import setup

setup()
