"""What a Python user's "plain download" of the bench's shards gets from the
same server, for comparison with `benches/storage.rs`'s `download` (one
whole-object GET per shard in Rust, all at once, the bar of issue 21):

- `transfer`: boto3's transfer manager, what `aws s3 cp` uses (objects over
  8 MiB in 8 MiB ranged GETs, 10 threads per object), into memory;
- `get_object`: `get_object(...)['Body'].read()`, one thread per object.

Run after the bench has uploaded the shards (it leaves them in the bucket):

    python benches/boto3_download.py http://127.0.0.1:5055 bench 3
"""

import io
import sys
import threading
import time

import boto3
from boto3.s3.transfer import TransferConfig


def main():
    endpoint, bucket, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    objects = [
        o
        for o in s3.list_objects_v2(Bucket=bucket)["Contents"]
        if o["Key"].endswith(".tfrecord")
    ]
    total = sum(o["Size"] for o in objects)

    def transfer(key):
        s3.download_fileobj(bucket, key, io.BytesIO(), Config=TransferConfig())

    def get_object(key):
        s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    for name, fetch in [("transfer (aws s3 cp)", transfer), ("get_object", get_object)]:
        for r in range(rounds):
            start = time.time()
            threads = [threading.Thread(target=fetch, args=(o["Key"],)) for o in objects]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - start
            print(
                f"{name}: round {r}: {total / 1e6 / wall:.0f} MB/s "
                f"({wall:.2f} s, {len(objects)} objects, {total / 1e6:.0f} MB)"
            )


if __name__ == "__main__":
    main()
