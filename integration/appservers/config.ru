# A Rack app for Puma under deployd (integration/appservers_test.go and the
# compatibility harness). PUMA_APP_MODE=broken fails at boot; slow boots 2 s
# late, as an app loading its code would.
case ENV["PUMA_APP_MODE"]
when "broken" then raise "boot failed: PUMA_APP_MODE=broken"
when "slow" then sleep 2
end
body = "version=#{ENV["APP_VERSION"]} pid=#{Process.pid} slot=#{ENV["DEPLOYD_WORKER"]}\n"
run ->(_env) { [200, { "Content-Type" => "text/plain" }, [body]] }
