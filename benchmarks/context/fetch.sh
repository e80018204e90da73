#!/usr/bin/env bash
# Fetches the packages the workspace-context measurements ran on (sources, pinned) into
# ${1:-/work/ctxdata/dl}; they stay out of the repository. See README.md beside this file.
set -euo pipefail
dest="${1:-/work/ctxdata/dl}"
mkdir -p "$dest"
cd "$dest"
for pkg in gepa==0.1.4 claude-agent-sdk==0.2.189 openai-agents==0.24.0 deepagents==0.7.32 \
           strands-agents==1.62.0 google-adk==2.13.0 a2a-sdk==1.3.0; do
  python -m pip download -q --no-deps --no-binary :all: "$pkg" -d .
done
for f in gepa-0.1.4.tar.gz claude_agent_sdk-0.2.189.tar.gz openai_agents-0.24.0.tar.gz \
         deepagents-0.7.32.tar.gz strands_agents-1.62.0.tar.gz google_adk-2.13.0.tar.gz \
         a2a_sdk-1.3.0.tar.gz; do
  tar xzf "$f"
done
echo "tune:  $dest/gepa-0.1.4/src  $dest/claude_agent_sdk-0.2.189/src  $dest/openai_agents-0.24.0/src"
echo "check: $dest/deepagents-0.7.32  $dest/strands_agents-1.62.0/src  $dest/google_adk-2.13.0/src  $dest/a2a_sdk-1.3.0/src"
