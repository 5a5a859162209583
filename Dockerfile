# Pitstop bot image: the Slack surface and scheduler (no torch: training runs on the GPU hosts).
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client git \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY handlers ./handlers
COPY pipeline ./pipeline
COPY devhost ./devhost
RUN pip install --no-cache-dir . && useradd --create-home pitstop
USER pitstop
ENV PITSTOP_CONFIG=/etc/pitstop/pitstop.toml
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:9300/healthz', timeout=4)" || exit 1
EXPOSE 3000 9300
ENTRYPOINT ["pitstop"]
CMD ["serve", "--port", "3000"]
