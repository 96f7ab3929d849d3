"""Only the build step pyproject.toml cannot say: dags/ and plugins/ go into the wheel.

They live at the top of the checkout (Airflow's folders, not Python packages) and
are copied into the built package as ``pipeline/airflow_folders/{dags,plugins}``;
:func:`pipeline.airflow_folder` finds them in a wheel or in a checkout.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: The checkout's folders shipped in the wheel, and the files of each that go.
FOLDERS = {"dags": ("*.py",), "plugins": ("*.py", "*.html")}


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for name, patterns in FOLDERS.items():
            target = Path(self.build_lib, "pipeline", "airflow_folders", name)
            self.mkpath(str(target))
            for pattern in patterns:
                for source in sorted((root / name).glob(pattern)):
                    self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPy})
