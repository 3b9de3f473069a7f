"""ragpulse: `ragpulse.pipeline` (the service) and `ragpulse.judges` (the judges).

In the repository the two packages are the top-level folders pipeline/ and judges/; this
folder's two links make `import ragpulse.pipeline` work in a checkout, and pyproject.toml's
package-dir installs them as ragpulse/pipeline and ragpulse/judges, so an installed ragpulse
puts no package named `pipeline` or `judges` at the top of site-packages.
"""
